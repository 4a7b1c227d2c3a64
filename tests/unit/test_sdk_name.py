"""The SDK is `labelrm_client`; its old name `clients` still works for a release, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

import labelrm_client
from labelrm_client import _aio_rm


def _import_clients_afresh() -> ModuleType:
    """Import the `clients` shim as a first import would (its warning fires only then)."""
    for name in [n for n in sys.modules if n == "clients" or n.startswith("clients.")]:
        del sys.modules[name]
    with pytest.warns(DeprecationWarning, match="the SDK is labelrm_client now"):
        return importlib.import_module("clients")


def test_labelrm_client_imports_without_a_warning() -> None:
    # A fresh interpreter, every warning an error: the first import, not a cached one.
    code = "import labelrm_client; print(labelrm_client.AsyncRMClient.__name__)"
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "AsyncRMClient"


def test_old_name_warns_and_gives_the_same_objects() -> None:
    clients = _import_clients_afresh()
    assert clients.AsyncRMClient is labelrm_client.AsyncRMClient
    assert clients.RMClient is labelrm_client.RMClient
    assert clients.RMError is labelrm_client.RMError
    assert clients.labels_from is labelrm_client.labels_from
    assert sorted(clients.__all__) == sorted(labelrm_client.__all__)
    for name in labelrm_client.__all__:
        assert getattr(clients, name) is getattr(labelrm_client, name), name


def test_old_submodule_paths_are_the_new_modules() -> None:
    _import_clients_afresh()
    # The statements an old caller wrote (run by exec: mypy knows only labelrm_client).
    scope: dict[str, Any] = {}
    exec("from clients._aio_rm import AsyncRMCalls", scope)
    assert scope["AsyncRMCalls"] is _aio_rm.AsyncRMCalls
    assert sys.modules["clients._aio_rm"] is _aio_rm
    exec("import clients._errors", scope)
    assert scope["clients"]._errors.RMError is labelrm_client.RMError
    old_sync = importlib.import_module("clients._sync_rm")
    assert old_sync is importlib.import_module("labelrm_client._sync_rm")
