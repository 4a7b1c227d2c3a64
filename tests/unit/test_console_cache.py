"""The console's view cache (console/cache.py): within its time to live a view is
computed once however many ask, at the same time or one after another; a failure is
not kept; the number of kept views is bounded."""

from __future__ import annotations

import asyncio

import pytest

from rm_server.console.cache import ViewCache


async def test_one_computation_per_time_to_live_for_every_reader():
    now = [0.0]
    cache = ViewCache(clock=lambda: now[0])
    started = asyncio.Event()
    release = asyncio.Event()
    runs = [0]

    async def build() -> int:
        runs[0] += 1
        started.set()
        await release.wait()
        return runs[0]

    readers = [asyncio.ensure_future(cache.get("v", (), 2.0, build)) for _ in range(5)]
    await started.wait()
    release.set()
    assert await asyncio.gather(*readers) == [1] * 5  # at once: one computation
    assert await cache.get("v", (), 2.0, build) == 1  # later, within the time to live
    now[0] = 2.0
    assert await cache.get("v", (), 2.0, build) == 2  # expired: computed again
    assert cache.builds["v"] == 2 and cache.reads["v"] == 7
    assert await cache.get("v", ("other",), 2.0, build) == 3  # another key, its own


async def test_a_failure_is_not_kept_and_a_gone_reader_cancels_nothing():
    cache = ViewCache(clock=lambda: 0.0)
    calls = [0]

    async def failing() -> int:
        calls[0] += 1
        raise RuntimeError("database away")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            await cache.get("v", (), 5.0, failing)
    assert calls[0] == 2

    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return "done"

    first = asyncio.ensure_future(cache.get("w", (), 5.0, slow))
    second = asyncio.ensure_future(cache.get("w", (), 5.0, slow))
    await asyncio.sleep(0)
    first.cancel()  # that browser went away
    release.set()
    assert await second == "done"
    assert cache.builds["w"] == 1


async def test_expired_views_leave_memory():
    now = [0.0]
    cache = ViewCache(clock=lambda: now[0])

    async def value() -> int:
        return 1

    await cache.get("big", (), 2.0, value)
    now[0] = 5.0
    await cache.get("other", (), 2.0, value)  # any computation clears what expired
    assert cache.kept() == [("other",)]


async def test_kept_views_are_bounded_and_can_be_dropped():
    cache = ViewCache(clock=lambda: 0.0, max_entries=3)

    async def value() -> int:
        return 1

    for key in range(5):
        await cache.get("v", (key,), 60.0, value)
    await cache.get("v", (0,), 60.0, value)  # evicted: computed again
    assert cache.builds["v"] == 6
    cache.forget("v")
    await cache.get("v", (4,), 60.0, value)
    assert cache.builds["v"] == 7
