"""How rm-server runs its process: the event loop it picks and the start-up heap it
hides from the garbage collector (rm_server/main.py, rm_server/server.py)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from rm_server.main import main, run_on_loop
from rm_server.server import COLLECTOR_THRESHOLDS, tune_collector


def loop_module(event_loop: str) -> str:
    seen: list[str] = []

    async def probe() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    run_on_loop(probe(), event_loop)
    return seen[0]


def test_the_default_event_loop_is_uvloop_and_asyncio_can_be_chosen() -> None:
    assert loop_module("uvloop").startswith("uvloop")
    assert loop_module("asyncio").startswith("asyncio")


def test_an_unknown_event_loop_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--event-loop", "trio", "--listen", "127.0.0.1:1"])
    assert exited.value.code == 2
    assert "event_loop must be one of uvloop, asyncio" in capsys.readouterr().err


def test_the_start_up_heap_is_frozen_and_later_objects_are_collected() -> None:
    thresholds = gc.get_threshold()
    try:
        tune_collector()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert gc.get_threshold() == COLLECTOR_THRESHOLDS
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # made after the freeze: still collected
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
