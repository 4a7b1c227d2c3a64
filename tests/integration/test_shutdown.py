"""A drain never hangs the process: each shutdown step is bounded, one that does not finish
is logged by name and left behind, and the steps after it still run. (A test's in-process
RM once stayed in its stop for the whole 300 s test timeout, with nothing to say which step
it waited on.)"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from rm_server import server as server_module
from tests.support.rm import start_in_process


async def test_a_step_that_never_finishes_is_left_behind_by_name(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setattr(server_module, "SHUTDOWN_STEP_SECONDS", 3.0, raising=False)
    rm = await start_in_process(database_url)
    notifier = rm.server._notifier
    assert notifier is not None
    stop_listening = notifier.stop
    closed: list[str] = []
    db = rm.server._db
    assert db is not None
    close_pool = db.close

    async def never() -> None:
        await asyncio.Event().wait()  # a LISTEN connection whose peer never answers

    async def pool_closed() -> None:
        closed.append("pool")
        await close_pool()

    monkeypatch.setattr(notifier, "stop", never)
    monkeypatch.setattr(db, "close", pool_closed)
    await rm.channel.close()
    try:
        with caplog.at_level(logging.WARNING, logger="rm_server.server"):
            await asyncio.wait_for(rm.server.stop(grace=0.1), 60)
        lines = [r.getMessage() for r in caplog.records if r.name == "rm_server.server"]
        # (On a busy machine a background job cancelled in the middle of a query can take
        # longer than the shortened bound too: psycopg asks the server to cancel it first.
        # Such a step is named the same way.)
        assert (
            "shutdown: the LISTEN connection did not finish within 3 s; going on without it"
            in lines
        )
        assert all(
            line.endswith("did not finish within 3 s; going on without it") for line in lines
        )
        assert all(r.exc_info is None for r in caplog.records)
        assert closed == ["pool"]  # the steps after it ran
    finally:
        await stop_listening()
