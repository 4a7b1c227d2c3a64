"""The planner's passes over blocked demands: a round every interval however long a pass
takes, and one statement for all the blocked demands nothing changed for. Counted in
rounds and statements, never in time (the clock is injected, as in test_demands.py)."""

# ruff: noqa: F811 - the tests take the imported fixture `drm` as their argument

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from labelrm.v1 import demand_pb2 as dpb

from rm_server.clock import ManualClock
from tests.helpers import label_state
from tests.integration.test_demands import (
    ROUND,
    USER,
    DemandRM,
    drm,  # noqa: F401 - the fixture the tests name
    plain_apply,
)


class SlowPass:
    """The injected clock, one second later at every reading: each pass takes a while."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def now(self) -> datetime:
        return self.clock.advance(1)


async def _passes_one_interval_apart(
    drm: DemandRM, monkeypatch: pytest.MonkeyPatch, passes: int, *, forget: bool
) -> None:
    """`passes` passes whose starts are one interval apart (as the background task runs
    them: the interval counts from the start of a pass), each taking a few seconds of the
    injected clock. `forget`: the planner forgets its refusals (a round tries again)."""
    first = drm.clock.now()
    interval = timedelta(seconds=ROUND)
    with monkeypatch.context() as patch:
        patch.setattr(drm.manager, "clock", SlowPass(drm.clock))
        for k in range(1, passes + 1):
            drm.clock.advance((first + k * interval - drm.clock.now()).total_seconds())
            if forget:
                drm.manager._blocked.clear()
            await drm.manager.tick()
            assert drm.clock.now() < first + (k + 1) * interval  # the pass took less


@pytest.mark.parametrize("forget", [False, True], ids=["passed-over", "tried"])
async def test_a_blocked_demand_gets_a_round_every_interval(drm, monkeypatch, forget):
    """Rounds are dated from the start of their pass. Dated from the round's own time (a
    little after the start of the pass), the next round was not yet due when the next pass
    started, and a blocked demand got a round every *second* interval."""
    hog = await plain_apply(drm, 4)
    assert hog is not None
    await drm.submit("blocked", 1, "{Start: [NOW, +1h]}")
    await drm.tick()  # reserved, tried and refused: passed over once
    assert (await drm.get("blocked")).passed_over_rounds == 1
    await _passes_one_interval_apart(drm, monkeypatch, 6, forget=forget)
    assert (await drm.get("blocked")).passed_over_rounds == 1 + 6  # one round every pass
    await drm.consistent()


async def test_a_pass_over_unchanged_blocked_demands_is_one_statement(drm, monkeypatch):
    """The blocked demands nothing changed for are passed over together: one UPDATE counts
    all their rounds, and no label row is locked for them."""
    hog = await plain_apply(drm, 4)
    assert hog is not None
    names = [f"blocked-{i:02}" for i in range(20)]
    for name in names:
        await drm.submit(name, 0.1, "{Start: [NOW, +1h]}")
    await drm.tick()  # each reserved, tried and refused
    await drm.tick()  # tried again: the others' reservations changed the label since
    statements: list[str] = []
    execute = psycopg.AsyncConnection.execute

    async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self)
        if "demand" in text or "label_resource" in text:
            statements.append(text)
        return await execute(self, query, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(psycopg.AsyncConnection, "execute", counted)
        for _ in range(3):
            drm.clock.advance(ROUND)
            statements.clear()
            assert await drm.manager.tick() == len(names)  # a round each ...
            updates = [s for s in statements if s.startswith(("UPDATE demand", "WITH"))]
            assert len(updates) == 1, statements  # ... counted by one statement
            assert not [s for s in statements if "FOR UPDATE OF r" in s]  # no label lock
            assert len(statements) < len(names) // 2, statements  # not one per demand
    assert {(await drm.get(n)).passed_over_rounds for n in names} == {5}
    await drm.release(hog.ticket_id)
    await drm.tick()  # the label changed: each tried again, and allocated
    assert {(await drm.get(n)).state for n in names} == {dpb.DEMAND_STATE_ALLOCATED}
    await drm.consistent()


async def test_a_changed_label_ends_the_pass_over(drm, monkeypatch):
    """A blocked demand is passed over without a try only while its labels are as they
    were when it was refused: an ordinary ticket released on them makes it tried again."""
    from rm_server.store import demands as demand_store

    tries: list[str] = []
    allocate = demand_store.allocate

    async def counted(conn, d, cmd):
        tries.append(d.demand_id)
        return await allocate(conn, d, cmd)

    monkeypatch.setattr(demand_store, "allocate", counted)
    hog = await plain_apply(drm, 3.5)
    small = await plain_apply(drm, 0.25)
    assert hog is not None and small is not None
    await drm.submit("big", 1, "{Start: [NOW, +1h]}")
    await drm.tick()
    await drm.tick()
    assert tries == ["big"]  # tried once, then passed over
    await drm.release(small.ticket_id)  # room for 0.5 of 1: refused again, but tried
    await drm.tick()
    assert tries == ["big", "big"]
    await drm.tick()
    assert tries == ["big", "big"] and (await drm.get("big")).passed_over_rounds == 4
    await drm.consistent()


async def test_a_pass_over_blocked_demands_waits_for_no_label(drm):
    """An Apply holding the label (its row locked) holds up neither the pass over the
    demands blocked on it nor a submission on it: neither takes the label's row lock."""
    import asyncio

    hog = await plain_apply(drm, 4)
    assert hog is not None
    names = [f"blocked-{i:02}" for i in range(5)]
    for name in names:
        await drm.submit(name, 0.1, "{Start: [NOW, +1h]}")
    await drm.tick()  # each reserved, tried and refused
    await drm.tick()  # tried again: the others' reservations changed the label since
    label = (await label_state(drm.rm, USER)).label
    drm.clock.advance(ROUND)
    holder = await psycopg.AsyncConnection.connect(drm.rm.database_url)
    async with holder, holder.transaction():
        await holder.execute("SELECT 1 FROM label_resource WHERE label = %s FOR UPDATE", (label,))
        # A deadline against a hang, not a measure: waiting for the holder never ends.
        assert await asyncio.wait_for(drm.manager.tick(), 120) == len(names)
        late = await asyncio.wait_for(drm.submit("late", 0.1, "{Start: [+1h, ]}"), 120)
        assert late.created
    assert {(await drm.get(n)).passed_over_rounds for n in names} == {3}
    await drm.consistent()
