"""Where the tests run: paths, the test users and their EngineConn runtime, what CI requires, and the settings the EngineConn tests use."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]


T = TypeVar("T")


# The sudo test users (scripts/create_test_users.sh) and the EngineConn runtime they run
# (the `ec_python` fixture has scripts/install_ec_runtime.sh install it there).
TEST_USERS = ("lrmtest_a", "lrmtest_b")


# Each checkout's tests get a runtime of their own (two checkouts' test runs on one
# machine must not reinstall each other's code under running EngineConns).
EC_VENV = Path(
    os.environ.get("LABELRM_EC_VENV")
    or f"/opt/labelrm/ec-venv-test-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]}"
)


# The one spelling of "running in CI": .ci/run exports CI=true.
IN_CI = os.environ.get("CI") == "true"


def unavailable(reason: str) -> NoReturn:
    """A test's prerequisite is missing: in CI, where everything must run, the test
    fails; elsewhere it is skipped with the reason (and what to install)."""
    if IN_CI:
        pytest.fail(f"CI prerequisite missing: {reason}")
    pytest.skip(reason)


# Short liveness intervals for EngineConn tests (agents and EngineConns come and go).
ENGINECONN_TEST_SETTINGS: dict[str, Any] = {
    "sweep_interval": 0.2,
    "ecm_expiry": 3.0,
    "ec_expiry": 6.0,
    "agent_heartbeat_interval": 0.5,
    "ec_heartbeat_interval": 0.5,
    "create_timeout": 30.0,
    "kill_grace": 2.0,
}


# The two ways Apply / ReportUsed / Release run: grouped with concurrent requests in
# shared transactions (the default), and one transaction per request (batch_max = 0).
GROUPING = {"grouped": 256, "one-by-one": 0}


# A test module with `pytestmark = BOTH_PATHS` runs every test once per GROUPING value
# (the `grouping` fixture of tests/fixtures/rm.py).
BOTH_PATHS = pytest.mark.usefixtures("grouping")


def shared_tmp(prefix: str) -> Path:
    """A temporary directory the test users can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def private_tmp(prefix: str) -> Path:
    """A fresh 0700 directory of root's, like /root: the database user (and the test
    users) cannot pass it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def remove_with_relocated(path: Path) -> None:
    """Remove `path` and what root's rm-servers kept elsewhere for data directories in
    it that others could not reach: their homes (rm_server/relocated.py), found by the
    data directory each names, whatever happened to its links. rm-server would remove
    them at its next start as root; a test leaves nothing for later."""
    from rm_server.relocated import RELOCATED_ROOT, read_owner

    homes = []
    if RELOCATED_ROOT.is_dir():
        for home in RELOCATED_ROOT.iterdir():
            owner = read_owner(home)
            if owner is not None and owner.data_dir.is_relative_to(path.resolve()):
                homes.append(home)
    shutil.rmtree(path, ignore_errors=True)
    for home in homes:
        shutil.rmtree(home, ignore_errors=True)
