"""The planner's passes: a blocked demand passed over once every interval however long a
pass takes; parked demands (blocked with no more room on their labels, waiting for their
OrderBy) cost a pass nothing until what they wait for changes. Counted in rounds and
statements, never in time (the clock is injected, as in test_demands.py)."""

# ruff: noqa: F811 - the tests take the imported fixture `drm` as their argument

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from labelrm.v1 import demand_pb2 as dpb
from labelrm.v1 import resource_manager_pb2 as rpb

from rm_server.clock import ManualClock
from rm_server.store import demands as demand_store
from tests.integration.test_demands import (
    ROUND,
    USER,
    DemandRM,
    drm,  # noqa: F401 - the fixture the tests name
    plain_apply,
)
from tests.support.messages import GiB, apply_req, lbl, load
from tests.support.rm import label_state


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
        patch.setattr(drm.planner, "clock", SlowPass(drm.clock))
        for k in range(1, passes + 1):
            drm.clock.advance((first + k * interval - drm.clock.now()).total_seconds())
            if forget:
                drm.planner._parked.clear()
            await drm.planner.tick()
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


def _counting_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements on demands and label records from here on (texts, in order)."""
    statements: list[str] = []
    execute = psycopg.AsyncConnection.execute

    async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self)
        if "demand" in text or "label_resource" in text:
            statements.append(text)
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counted)
    return statements


async def test_a_pass_over_unchanged_blocked_demands_writes_nothing(drm, monkeypatch):
    """Blocked demands whose labels have no more room than when they were refused are
    parked: a pass reads their labels' records (one row a label) and writes nothing, locks
    no label; their passed-over rounds count on with the time all the same."""
    hog = await plain_apply(drm, 4)
    assert hog is not None
    names = [f"blocked-{i:02}" for i in range(20)]
    for name in names:
        await drm.submit(name, 0.1, "{Start: [NOW, +1h]}")
    await drm.tick()  # each reserved, tried and refused: parked
    await drm.tick()  # compared with the others' reservations since: no more room
    with monkeypatch.context() as patch:
        statements = _counting_statements(patch)
        for _ in range(3):
            drm.clock.advance(ROUND)
            statements.clear()
            assert await drm.planner.tick() == 0  # no round for any of them ...
            writes = [s for s in statements if s.lstrip().startswith(("UPDATE", "WITH", "INSERT"))]
            assert writes == [], statements
            assert not [s for s in statements if "FOR UPDATE" in s]  # ... and no lock
            assert len(statements) <= 4, statements  # a count, the labels, the due ones
    assert {(await drm.get(n)).passed_over_rounds for n in names} == {5}  # still counted
    await drm.release(hog.ticket_id)
    await drm.tick()  # the label changed: each tried, and allocated
    assert {(await drm.get(n)).state for n in names} == {dpb.DEMAND_STATE_ALLOCATED}
    await drm.consistent()


async def test_a_pass_costs_the_demands_whose_labels_changed(drm, monkeypatch):
    """Demands blocked on two labels; room comes back on one: the pass gives a round to
    the demands on that label only."""
    other = "userCreator=bob-IDE,engineType=spark-3.2.1"
    hogs = [await plain_apply(drm, 4)]
    bob_hog = await drm.rm.rm.Apply(apply_req(other, load(4 * GiB, 100)))
    for i in range(6):
        await drm.submit(f"alice-{i}", 0.5, "{Start: [NOW, +1h]}")
        await drm.stub.SubmitDemand(
            dpb.SubmitDemandRequest(
                demand_id=f"bob-{i}",
                user="bob",
                labels=lbl(other),
                resource=load(GiB // 2, 100),
                time_conditions_text="{Start: [NOW, +1h]}",
            )
        )
    await drm.tick()
    await drm.tick()
    rounds: list[str] = []
    claim = demand_store.claim_due

    async def counted(conn: Any, key: Any, due: Any) -> Any:
        found = await claim(conn, key, due)
        if found is not None:
            rounds.append(found.demand_id)
        return found

    monkeypatch.setattr(demand_store, "claim_due", counted)
    await drm.rm.rm.Release(rpb.ReleaseRequest(ticket_id=bob_hog.ticket.ticket_id))
    await drm.tick()
    assert sorted(rounds) == [f"bob-{i}" for i in range(6)]
    assert all(hogs)
    await drm.consistent()


async def test_an_ordered_demand_gets_no_round_until_its_predecessor_ends(drm, monkeypatch):
    """Waiting for its OrderBy, a demand is parked: no round in the passes while its
    predecessor runs; its predecessor's end wakes it at once."""
    await drm.submit("first", 1, "{Duration: +10m}")
    await drm.submit("second", 1, "{OrderBy: first, Duration: +10m}")
    await drm.tick()
    first = await drm.claim("first")
    rounds: list[str] = []
    claim = demand_store.claim_due

    async def counted(conn: Any, key: Any, due: Any) -> Any:
        found = await claim(conn, key, due)
        if found is not None:
            rounds.append(found.demand_id)
        return found

    monkeypatch.setattr(demand_store, "claim_due", counted)
    for _ in range(5):
        await drm.tick()
    assert "second" not in rounds and await drm.state("second") == dpb.DEMAND_STATE_ACCEPTED
    await drm.release(first.ticket.ticket_id)
    await drm.tick()  # first FINISHES, which wakes second: its round, in the next pass
    await drm.tick()
    assert "second" in rounds
    assert (await drm.get("second")).state in (
        dpb.DEMAND_STATE_ALLOCATING,
        dpb.DEMAND_STATE_ALLOCATED,
    )
    await drm.consistent()


async def test_a_changed_label_ends_the_pass_over(drm, monkeypatch):
    """A blocked demand is passed over without a try only while its labels are as they
    were when it was refused: an ordinary ticket released on them makes it tried again."""
    from rm_server.store import demand_reservations

    tries: list[str] = []
    allocate = demand_reservations.allocate

    async def counted(conn, d, cmd):
        tries.append(d.demand_id)
        return await allocate(conn, d, cmd)

    monkeypatch.setattr(demand_reservations, "allocate", counted)
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
    await drm.tick()  # each reserved, tried and refused: parked
    await drm.tick()  # compared with the others' reservations since: no more room
    label = (await label_state(drm.rm, USER)).label
    drm.clock.advance(ROUND)
    holder = await psycopg.AsyncConnection.connect(drm.rm.database_url)
    async with holder, holder.transaction():
        await holder.execute("SELECT 1 FROM label_resource WHERE label = %s FOR UPDATE", (label,))
        # A deadline against a hang, not a measure: waiting for the holder never ends.
        assert await asyncio.wait_for(drm.planner.tick(), 120) == 0  # all still parked
        late = await asyncio.wait_for(drm.submit("late", 0.1, "{Start: [+1h, ]}"), 120)
        assert late.created
    assert {(await drm.get(n)).passed_over_rounds for n in names} == {3}
    await drm.consistent()


async def test_a_parked_demand_occupies_the_plan_from_now(drm):
    """No pass writes a parked demand's row, yet its occupation of the plan moves with the
    time: GetDemand, the wait of a demand ordered after it and admission all see it start
    now and end its Duration later, not where it was when it was parked."""
    hog = await plain_apply(drm, 4)
    assert hog is not None
    await drm.submit("blocked", 1, "{Start: [NOW, +2h], Duration: +10m}")
    await drm.submit("after", 1, "{OrderBy: blocked, Duration: +1m}")
    await drm.tick()  # blocked: reserved, refused, parked
    drm.clock.advance(10 * 60)  # no round meanwhile (nothing changed, no instant due)
    now = drm.clock.now()
    d = await drm.get("blocked")
    end = now + timedelta(minutes=10)
    assert d.plan_end_time.ToDatetime(tzinfo=now.tzinfo) == end
    assert d.plan_start_time.ToDatetime(tzinfo=now.tzinfo) == now - timedelta(seconds=60)
    stamp = end.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (
        await drm.get("after")
    ).waiting == f"waiting for blocked: ALLOCATING, planned end {stamp}"
    # Admission sees it there too: beside it and `after` (1 GiB each, both from now on) 2
    # GiB more fit now, 2.5 do not (ended where it was parked, it would leave room).
    await drm.submit("beside", 2, "{Start: [NOW, +30s], Duration: +1m}")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await drm.submit("too-much", 0.5, "{Start: [NOW, +30s], Duration: +1m}")
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await drm.consistent()
