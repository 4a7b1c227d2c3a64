"""An allocation is recorded at the time it becomes visible, not before: a request that
still sees a demand ALLOCATING was answered before its allocate_time, and a strict window
is honoured in what users can observe. Driven by the injected clock (test_demands.py),
which the round reads as it goes: nothing is timed."""

# ruff: noqa: F811 - the tests take the imported fixture `drm` as their argument

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from labelrm.v1 import demand_pb2 as dpb

from rm_server.clock import ManualClock
from rm_server.store import demands as demand_store
from tests.integration.test_demands import (
    DemandRM,
    drm,  # noqa: F401 - the fixture the tests name
    plain_apply,
)


class Ticking:
    """The injected clock, `step` seconds later at every reading: a round takes a while."""

    def __init__(self, clock: ManualClock, step: float) -> None:
        self.clock, self.step = clock, step

    def now(self) -> datetime:
        return self.clock.advance(self.step)


def _at(ts: Timestamp, like: datetime) -> datetime:
    return ts.ToDatetime(tzinfo=like.tzinfo)


async def _blocked(drm: DemandRM, text: str) -> Any:
    """A demand reserved, tried and refused behind an ordinary ticket; that ticket."""
    hog = await plain_apply(drm, 4)
    assert hog is not None
    await drm.submit("d", 1, text)
    await drm.tick()
    assert await drm.state("d") == dpb.DEMAND_STATE_ALLOCATING
    return hog


async def test_no_answer_sees_allocating_after_the_recorded_allocation(drm, monkeypatch):
    """Between the allocation's write and its commit, another request reads the demand:
    it is still ALLOCATING there, so the recorded allocate_time must be later than that
    request. (Recorded at the decision, it was earlier: the round's clock had moved on.)"""
    seen: list[tuple[datetime, int]] = []
    move = demand_store.move

    async def watched(conn: Any, d: Any, target: Any, *args: Any, **kw: Any) -> Any:
        moved = await move(conn, d, target, *args, **kw)
        if target.value == "ALLOCATED":  # written, not committed: what others see now
            asked = drm.planner.clock.now()
            seen.append((asked, await drm.state("d")))
        return moved

    hog = await _blocked(drm, "{Start: [NOW, +1h]}")
    await drm.release(hog.ticket_id)
    monkeypatch.setattr(demand_store, "move", watched)
    monkeypatch.setattr(drm.planner, "clock", Ticking(drm.clock, 0.001))
    drm.clock.advance(10)  # its next round
    await drm.planner.tick()
    d = await drm.get("d")
    assert d.state == dpb.DEMAND_STATE_ALLOCATED
    assert [state for _, state in seen] == [dpb.DEMAND_STATE_ALLOCATING]
    allocated = _at(d.allocate_time, seen[0][0])
    assert all(asked < allocated for asked, _ in seen), (seen, allocated)
    assert _at(d.claim_expire_time, allocated) == allocated + timedelta(seconds=300)
    await drm.consistent()


async def test_a_strict_window_closing_before_the_allocation_is_visible(drm):
    """Room appears a tenth of a second before a strict window closes: an allocation then
    would be seen after the window (the commit margin is a quarter of a second). It is
    not made, and the demand FAILS when the window has closed."""
    t0 = drm.clock.now()
    hog = await _blocked(drm, "{Start: [NOW, +2m]}")
    await drm.release(hog.ticket_id)
    drm.clock.advance((t0 + timedelta(seconds=120) - drm.clock.now()).total_seconds() - 0.1)
    await drm.planner.tick()
    assert await drm.state("d") == dpb.DEMAND_STATE_ALLOCATING
    await drm.tick()
    d = await drm.get("d")
    assert d.state == dpb.DEMAND_STATE_FAILED and "strict start window closed" in d.reason
    assert dpb.DEMAND_STATE_ALLOCATED not in [e.to_state for e in d.events]
    await drm.consistent()


@pytest.mark.parametrize("step", [0.2])
async def test_an_allocation_not_committing_in_time_is_given_up(drm, monkeypatch, step):
    """A round so slow that its commit could land after the recorded time (each clock
    reading 0.2 s later, the margin 0.25 s) gives the allocation up; the next round on
    time makes it."""
    hog = await _blocked(drm, "{Start: [NOW, +1h]}")
    await drm.release(hog.ticket_id)
    drm.clock.advance(10)  # its next round
    with monkeypatch.context() as patch:
        patch.setattr(drm.planner, "clock", Ticking(drm.clock, step))
        await drm.planner.tick()
    assert await drm.state("d") == dpb.DEMAND_STATE_ALLOCATING
    await drm.consistent()  # nothing of the given-up allocation is left
    await drm.tick()
    assert await drm.state("d") == dpb.DEMAND_STATE_ALLOCATED
    await drm.consistent()
