"""The SDK's blocking client is generated from the async one: the checked-in copy must be
what scripts/gen_sync_client.py writes now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def test_generated_sync_client_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_sync_client.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_sync_and_async_clients_have_the_same_methods() -> None:
    from labelrm_client import AsyncRMClient, RMClient

    def public(cls: type) -> set[str]:
        return {name for name in dir(cls) if not name.startswith("_")}

    assert public(RMClient) == public(AsyncRMClient)


def _generator() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_sync_client", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = ROOT / "scripts" / "gen_sync_client.py"

NEW_METHODS = '''"""Calls."""

from collections.abc import AsyncIterator

import grpc

from labelrm_client._aio_base import AsyncClientBase

__all__ = ["AsyncExtraCalls"]


class AsyncExtraCalls(AsyncClientBase):
    async def nested(self, name: str) -> str:
        """A coroutine: the ticket of `name`."""
        return (
            await self._call(self._rm.GetTicket, rq.get(name, labels_of(name)))
        ).ticket

    async def each(self) -> AsyncIterator[int]:
        """Returns an async iterator."""
        async with grpc.aio.insecure_channel("x") as channel:
            async for item in channel.stream():  # noqa: ASYNC109 - as in create
                yield item
'''


def test_every_async_construct_is_turned_wherever_it_is() -> None:
    """A new method is translated from its syntax tree: parenthesised awaits spanning
    lines, nested calls, async with / for, `__all__`, and its docstring."""
    out = _generator().translate("_aio_extra.py", NEW_METHODS)
    assert "async" not in out.split('"""Calls."""', 1)[1].replace("_aio_extra", "")
    assert "await" not in out and "coroutine" not in out.lower().replace("_aio_", "")
    assert "class ExtraCalls(ClientBase):" in out
    assert '__all__ = ["ExtraCalls"]' in out
    assert "from labelrm_client._sync_base import ClientBase" in out
    # Parentheses spanning lines stay (the expression goes on after the line break).
    assert (
        "return (\n            self._call(self._rm.GetTicket, rq.get(name, labels_of(name)))\n        ).ticket"
        in out
    )
    assert "A blocking call: the ticket of `name`." in out
    assert 'with grpc.insecure_channel("x") as channel:' in out
    assert "for item in channel.stream():\n" in out  # the noqa comment went with `async`
    assert "-> Iterator[int]:" in out and "Returns an iterator." in out
    compile(out, "_sync_extra.py", "exec")


def test_a_docstring_the_rules_cannot_turn_stops_the_generator() -> None:
    gen = _generator()
    text = NEW_METHODS.replace('"""Returns an async iterator."""', '"""Await it in a task."""')
    try:
        gen.translate("_aio_extra.py", text)
    except SystemExit as stop:
        assert "a docstring says 'Await'" in str(stop)
    else:
        raise AssertionError("an async docstring went into the blocking client unturned")
