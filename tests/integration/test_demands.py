"""Time-aware demands through gRPC, on a real database, with an injected clock: the
planner's rounds are driven by the test (``tick``), so nothing waits in real time."""

from __future__ import annotations

import contextlib
import io
import random
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2
from labelrm.v1 import demand_pb2 as dpb
from labelrm.v1 import demand_pb2_grpc, resource_pb2
from labelrm.v1 import resource_manager_pb2 as rpb

from rm_server.app.demand_planner import DemandPlanner
from rm_server.app.demands import DemandManager
from rm_server.clock import ManualClock
from rm_server.domain.demands.evaluation import (
    holds,
    resolve,
)
from rm_server.domain.demands.timelang import (
    Span,
    parse,
)
from tests.support.messages import GiB, apply_req, lbl, limit_req, load, register
from tests.support.refusals import refused
from tests.support.rm import (
    InProcessRM,
    assert_consistent,
    label_state,
    start_in_process,
    stop_in_process,
)
from tests.support.waiting import wait_until

USER = "userCreator=alice-IDE,engineType=spark-3.2.1"
LIMIT = "userCreator=*,engineType=*"
ROUND = 10.0  # seconds of injected time between two rounds of one demand
LEAD = 60.0
CLAIM = 300.0
SLIP = 900.0
S = dpb


@dataclass
class DemandRM:
    rm: InProcessRM
    stub: demand_pb2_grpc.DemandServiceStub
    manager: DemandManager
    planner: DemandPlanner  # manager.planning, driven by the tests
    clock: ManualClock

    async def tick(self, seconds: float = ROUND) -> None:
        """Move the clock on, then run one planner pass (as the background task would)."""
        self.clock.advance(seconds)
        await self.planner.tick()

    async def submit(self, demand_id: str, memory_gib: float, text: str = "", **kw: Any):
        req = dpb.SubmitDemandRequest(
            demand_id=demand_id,
            labels=lbl(USER),
            resource=load(int(memory_gib * GiB), 100),
            user="alice",
            **kw,
        )
        if text:
            req.time_conditions_text = text
        return await self.stub.SubmitDemand(req)

    async def get(self, demand_id: str) -> dpb.Demand:
        return (await self.stub.GetDemand(dpb.GetDemandRequest(demand_id=demand_id))).demand

    async def state(self, demand_id: str) -> int:
        state: int = (await self.get(demand_id)).state
        return state

    async def claim(self, demand_id: str) -> dpb.ClaimDemandResponse:
        return await self.stub.ClaimDemand(dpb.ClaimDemandRequest(demand_id=demand_id))

    async def release(self, ticket_id: str) -> None:
        await self.rm.rm.Release(rpb.ReleaseRequest(ticket_id=ticket_id))

    async def consistent(self) -> None:
        await assert_consistent(self.rm)
        assert await self.manager.check_reservations() == []


# The RM settings of these tests (their planner driven by the test, not by the time).
DEMAND_SETTINGS: dict[str, Any] = {
    "lock_timeout": 3600.0,
    "sweep_interval": 3600.0,
    "demand_interval": ROUND,
    "demand_lead_time": LEAD,
    "demand_claim_timeout": CLAIM,
    "demand_loose_slip": SLIP,
    "demand_default_duration": 3600.0,
}


async def start_drm(database_url: str, **overrides: Any) -> DemandRM:
    """An in-process RM with an injected clock whose planner the test drives (``tick``),
    and a limit of 4 GiB / 4 cores on the users' labels; stop it with ``stop_in_process``."""
    clock = ManualClock()
    settings: dict[str, Any] = {**DEMAND_SETTINGS, **overrides}
    rm = await start_in_process(database_url, clock=clock, **settings)
    manager = rm.server.demands
    assert manager is not None
    await manager.planning.stop_background()  # the tests drive the rounds
    await rm.admin.SetLabelLimit(limit_req(LIMIT, load(4 * GiB, 4000)))
    stub = demand_pb2_grpc.DemandServiceStub(rm.channel)
    return DemandRM(rm, stub, manager, manager.planning, clock)


@pytest.fixture
async def drm(database_url):
    d = await start_drm(database_url)
    try:
        yield d
    finally:
        await stop_in_process(d.rm)


def rpc_error(exc: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> tuple[Any, str, list[Any]]:
    status = status_pb2.Status.FromString(
        dict(exc.value.trailing_metadata())["grpc-status-details-bin"]
    )
    details = []
    for any_msg in status.details:
        for kind in (
            error_details_pb2.ErrorInfo,
            error_details_pb2.BadRequest,
            error_details_pb2.QuotaFailure,
        ):
            if any_msg.Is(kind.DESCRIPTOR):
                msg = kind()
                any_msg.Unpack(msg)
                details.append(msg)
    return exc.value.code(), exc.value.details(), details


async def plain_apply(d: DemandRM, memory_gib: float) -> rpb.Ticket | None:
    """An ordinary Apply: its ticket, or None when refused for lack of capacity."""
    try:
        resp = await d.rm.rm.Apply(apply_req(USER, load(int(memory_gib * GiB), 100)))
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
        return None
    return resp.ticket


async def blocked_behind_a_hog(
    drm: DemandRM, count: int, memory_gib: float, window: str
) -> tuple[rpb.Ticket, list[str]]:
    """An ordinary ticket that fills the label, then `count` demands due now behind it:
    the ticket and the demands' ids."""
    hog = await plain_apply(drm, 4)
    assert hog is not None
    names = [f"blocked-{i:02}" for i in range(count)]
    for name in names:
        await drm.submit(name, memory_gib, window)
    return hog, names


# ----- the life of a demand --------------------------------------------------------------------


async def test_window_honoured_reserved_allocated_claimed_finished(drm):
    t0 = drm.clock.now()
    resp = await drm.submit("d1", 3, "{Start: {Time: [+10m, +10m], Strategy: strict}}")
    assert resp.created and resp.demand.state == S.DEMAND_STATE_ACCEPTED
    assert resp.demand.planned_start_time.ToDatetime(tzinfo=t0.tzinfo) == t0 + timedelta(minutes=10)
    await drm.tick(5 * 60)
    assert await drm.state("d1") == S.DEMAND_STATE_ACCEPTED
    # Outside the window (before the lead time) the capacity is anyone's.
    early = await plain_apply(drm, 3)
    assert early is not None
    await drm.release(early.ticket_id)
    await drm.tick(4 * 60)  # T+9m: one lead time before the start
    assert await drm.state("d1") == S.DEMAND_STATE_ALLOCATING
    assert await plain_apply(drm, 2) is None  # 3 of 4 are reserved
    small = await plain_apply(drm, 1)
    assert small is not None
    await drm.release(small.ticket_id)
    await drm.consistent()
    await drm.tick(30)  # still before T1: not allocated early
    assert await drm.state("d1") == S.DEMAND_STATE_ALLOCATING
    await drm.tick(30)  # T+10m
    d = await drm.get("d1")
    assert d.state == S.DEMAND_STATE_ALLOCATED and d.ticket_id
    # Recorded when it becomes visible: at the latest, the decision plus the commit margin.
    assert d.allocate_time.ToDatetime(tzinfo=t0.tzinfo) == t0 + timedelta(minutes=10, seconds=0.25)
    label = await label_state(drm.rm, USER)
    assert label.locked_resource.load.memory_bytes == 3 * GiB
    claimed = await drm.claim("d1")
    assert claimed.demand.state == S.DEMAND_STATE_MONITORING
    assert (
        claimed.ticket.ticket_id == d.ticket_id and claimed.ticket.state == rpb.TICKET_STATE_LOCKED
    )
    assert (await drm.claim("d1")).ticket.ticket_id == d.ticket_id  # claiming is idempotent
    await drm.consistent()
    await drm.release(d.ticket_id)
    await drm.tick()
    d = await drm.get("d1")
    assert d.state == S.DEMAND_STATE_FINISHED
    assert [e.to_state for e in d.events] == [
        S.DEMAND_STATE_NEW,
        S.DEMAND_STATE_ACCEPTED,
        S.DEMAND_STATE_ALLOCATING,
        S.DEMAND_STATE_ALLOCATED,
        S.DEMAND_STATE_MONITORING,
        S.DEMAND_STATE_FINISHED,
    ]
    assert all(e.reason for e in d.events) and all(e.time.seconds for e in d.events)
    after = await plain_apply(drm, 3)  # after the window: available again
    assert after is not None
    await drm.consistent()


async def test_reserved_capacity_is_shown_by_the_api_rmctl_and_metrics(drm):
    import asyncio

    from prometheus_client.parser import text_string_to_metric_families

    import rmctl

    await drm.submit("shown", 3, "{Start: {Time: [+2m, +10m], Strategy: strict}}")
    await drm.tick(60)  # one lead time before its start: reserved
    assert await drm.state("shown") == S.DEMAND_STATE_ALLOCATING
    label = await label_state(drm.rm, USER)
    assert label.reserved_resource.load.memory_bytes == 3 * GiB
    assert label.left_resource.load.memory_bytes == 1 * GiB  # what an Apply can still take
    assert await plain_apply(drm, 2) is None and await plain_apply(drm, 1) is not None
    listed = await drm.rm.rm.ListLabelResources(rpb.ListLabelResourcesRequest())
    (record,) = [r for r in listed.label_resources if r.label == label.label]
    assert record.reserved_resource == label.reserved_resource
    text = (await drm.rm.server.metrics.exposition()).decode()
    reserved = {
        sample.labels["dimension"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "labelrm_label_reserved"
        for sample in family.samples
        if sample.labels["label"] == label.label
    }
    assert reserved["memory_bytes"] == 3 * GiB
    for argv in (("resource", "show", USER), ("resource", "list")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = await asyncio.to_thread(rmctl.main, ["--rm", drm.rm.target, *argv])
        assert code == 0
        assert "reserved" in out.getvalue().lower() and "mem=3Gi" in out.getvalue()
    await drm.tick(60)  # allocated: the reservation became the ticket's
    assert await drm.state("shown") == S.DEMAND_STATE_ALLOCATED
    label = await label_state(drm.rm, USER)
    assert not label.HasField("reserved_resource")
    assert label.locked_resource.load.memory_bytes == 4 * GiB
    await drm.consistent()


async def test_strict_demand_fails_when_its_window_closes(drm):
    hog = await plain_apply(drm, 3)
    assert hog is not None
    await drm.submit("strict", 2, "{Start: [+1m, +1m]}")  # T2 is relative to T1: T+2m
    for _ in range(13):  # T+130s: past T2 = T+120s (both ends are inclusive)
        await drm.tick()
    d = await drm.get("strict")
    assert d.state == S.DEMAND_STATE_FAILED
    assert "strict start window closed" in d.reason
    assert d.passed_over_rounds >= 5
    assert not d.ticket_id
    await drm.consistent()
    label = await label_state(drm.rm, USER)
    assert label.locked_resource.load.memory_bytes == 3 * GiB


async def test_a_demand_is_allocated_at_its_planned_start_or_refused_at_submit(drm):
    t0 = drm.clock.now()
    tz = t0.tzinfo
    await drm.submit("first", 3, "{Start: [NOW, +1h], Duration: +4m}")
    await drm.tick(3)
    first = await drm.get("first")
    assert first.state == S.DEMAND_STATE_ALLOCATED
    await drm.claim("first")
    # Next to `first` the plan has room from the end of its occupation plus a lead time:
    # a start there falls 5 ms before the first window closes, a round and the commit
    # margin (0.25 s) before the second.
    edge = first.plan_end_time.ToDatetime(tzinfo=tz) + timedelta(seconds=LEAD)
    opens = (t0 + timedelta(minutes=1)).isoformat()
    accepted, refused = [], []
    margin = timedelta(seconds=ROUND + 0.25)
    for name, slack in (("edge", timedelta(milliseconds=5)), ("margin", margin)):
        text = f'{{Start: ["{opens}", "{(edge + slack).isoformat()}"], Duration: +1m}}'
        try:
            resp = await drm.submit(name, 3, text)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
            refused.append(name)
            continue
        accepted.append((name, resp.demand.planned_start_time.ToDatetime(tzinfo=tz)))
    # Rounds come when they come (here every 7 s, a round being 10 s): every admitted
    # demand is allocated within one round of its planned start.
    released = False
    for _ in range(60):
        await drm.tick(7)
        if not released and drm.clock.now() >= t0 + timedelta(minutes=4):
            await drm.release(first.ticket_id)  # `first` is done before its planned end
            released = True
    for name, planned in accepted:
        d = await drm.get(name)
        assert d.state == S.DEMAND_STATE_ALLOCATED, (name, d.reason)
        allocated = d.allocate_time.ToDatetime(tzinfo=tz)
        assert planned <= allocated < planned + timedelta(seconds=ROUND)
    assert refused == ["edge"] and [name for name, _ in accepted] == ["margin"]
    await drm.consistent()


async def _lock_waiters(conn) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    row = await cur.fetchone()
    return int(row[0])


async def test_a_pass_decides_each_round_at_its_own_time(drm):
    """A pass over many blocked demands takes time; a release during it makes room. The
    demands allocated after that release are allocated (and dated) after it."""
    import asyncio

    import psycopg

    hog = await plain_apply(drm, 3.9)
    small = await plain_apply(drm, 0.1)
    assert hog is not None and small is not None
    names = [f"blocked-{i:02}" for i in range(20)]
    for name in names:
        await drm.submit(name, 0.1, "{Start: [NOW, +1h]}")
    await drm.tick()  # each reserved and passed over once
    assert {(await drm.get(n)).passed_over_rounds for n in names} == {1}
    label = (await label_state(drm.rm, USER)).label
    await drm.release(small.ticket_id)  # more room (not enough): each is tried again
    drm.clock.advance(ROUND)  # all of them due again
    async with await psycopg.AsyncConnection.connect(drm.rm.database_url) as holder:
        async with holder.transaction():
            # Hold the label row: the pass stops at its first demand's allocation.
            await holder.execute(
                "SELECT 1 FROM label_resource WHERE label = %s FOR UPDATE", (label,)
            )
            async with await psycopg.AsyncConnection.connect(
                drm.rm.database_url, autocommit=True
            ) as watcher:
                passing = asyncio.ensure_future(drm.planner.tick())
                await wait_until(lambda: _at_least(_lock_waiters(watcher), 1), timeout=30)
                released_at = drm.clock.advance(5)  # the pass goes on while time passes
                release = asyncio.ensure_future(drm.release(hog.ticket_id))
                await wait_until(lambda: _at_least(_lock_waiters(watcher), 2), timeout=30)
        await release
        await passing
    allocated = []
    for name in names:
        d = await drm.get(name)
        if d.state == S.DEMAND_STATE_ALLOCATED:
            at = d.allocate_time.ToDatetime(tzinfo=released_at.tzinfo)
            assert at >= released_at, (name, at, released_at)
            allocated.append(name)
        times = [e.time.ToDatetime(tzinfo=released_at.tzinfo) for e in d.events]
        assert times == sorted(times)
    assert allocated  # the pass went on after the release and used its room
    await drm.consistent()


async def _at_least(count, n: int) -> bool:
    return bool(await count >= n)


async def test_blocked_demands_are_not_tried_again_until_their_labels_change(drm, monkeypatch):
    """Each round passes a blocked demand over; while nothing on its labels changed, it
    does so without trying the allocation again (the same rows would refuse it)."""
    from rm_server.store import demand_reservations

    tries: list[str] = []
    allocate = demand_reservations.allocate

    async def counted(conn, d, cmd):
        tries.append(d.demand_id)
        return await allocate(conn, d, cmd)

    monkeypatch.setattr(demand_reservations, "allocate", counted)
    hog, names = await blocked_behind_a_hog(drm, 10, 0.1, "{Start: [NOW, ^10]}")
    await drm.tick()
    assert sorted(tries) == names  # each reserved, tried and refused
    tries.clear()
    for _ in range(4):
        await drm.tick()
    # The label changed after most of them were refused (the others' reservations), but
    # only by taking more: no more room, not tried again ...
    assert tries == []
    assert {(await drm.get(n)).passed_over_rounds for n in names} == {5}  # ... but counted
    await drm.release(hog.ticket_id)
    await drm.tick()
    assert sorted(tries) == names  # room: each tried, and allocated
    assert {await drm.state(n) for n in names} == {S.DEMAND_STATE_ALLOCATED}
    await drm.consistent()


async def test_the_plan_reads_demands_planned_alike_as_one_group(drm):
    """The demands a round passes over are planned from the same time: the plan of their
    label reads as one group with their sum (admission sums groups, not demands), and a
    demand's own occupation is left out when it is placed again."""
    import psycopg

    from rm_server.store import demands as demand_store

    _, names = await blocked_behind_a_hog(drm, 12, 0.25, "{Start: [NOW, +1h]}")
    await drm.tick()
    label = (await label_state(drm.rm, USER)).label
    now = drm.clock.now()
    async with await psycopg.AsyncConnection.connect(drm.rm.database_url) as conn:
        planner = drm.manager.planner
        plan = await demand_store.plan_entries(conn, [label], now, ("alice", "nobody"), planner)
        without_one = await demand_store.plan_entries(
            conn, [label], now, ("alice", names[0]), planner
        )
    assert len(plan) == 1 and len(without_one) == 1
    assert plan[0].resource.get("memory_bytes") == 12 * GiB // 4
    assert without_one[0].resource.get("memory_bytes") == 11 * GiB // 4
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # the group counts in full
        await drm.submit("one-too-many", 1.5, "{Start: [NOW, +1h]}")
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_loose_demand_slips_within_the_bound(drm):
    t0 = drm.clock.now()
    hog = await plain_apply(drm, 3)
    assert hog is not None
    await drm.submit("loose", 2, "{Start: {Time: [+1m, +1m], Strategy: loose}}")
    for _ in range(18):  # three minutes: the window closed a minute ago
        await drm.tick()
    d = await drm.get("loose")
    assert d.state == S.DEMAND_STATE_ALLOCATING
    assert any("loose start window closed" in e.reason for e in d.events)
    await drm.release(hog.ticket_id)
    await drm.tick()
    d = await drm.get("loose")
    assert d.state == S.DEMAND_STATE_ALLOCATED and "slipping" in d.reason
    assert d.allocate_time.ToDatetime(tzinfo=t0.tzinfo) <= t0 + timedelta(minutes=2, seconds=SLIP)
    await drm.claim("loose")  # and holds it
    # A second loose demand that cannot slip far enough fails with the reason.
    hog = await plain_apply(drm, 1)
    assert hog is not None
    await drm.submit("late", 2, "{Start: {Time: [+20m, +1m], Strategy: loose}, Duration: +1m}")
    await drm.tick(20 * 60)
    await drm.tick(SLIP + 120)
    late = await drm.get("late")
    assert late.state == S.DEMAND_STATE_FAILED and "slip bound" in late.reason
    await drm.consistent()


async def test_loose_admission_slips_behind_an_accepted_demand(drm):
    await drm.submit("first", 3, "{Start: [+10m, +10m], Duration: +20m}")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await drm.submit("strict", 3, "{Start: [+15m, +5m], Duration: +20m}")
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    slipped = await drm.submit(
        "loose", 3, "{Start: {Time: [+15m, +5m], Strategy: loose}, Duration: +20m}"
    )
    d = slipped.demand
    assert d.state == S.DEMAND_STATE_ACCEPTED
    assert d.slip.seconds == 11 * 60  # first ends at +30m; +1m lead; window ends at +20m
    assert "past its window (loose)" in d.reason


async def test_order_by_chain_of_three(drm):
    await drm.submit("a", 1, "{Duration: +5m}")
    await drm.submit("b", 1, "{OrderBy: a, Duration: +5m}")
    await drm.submit("c", 1, "{DemandID: c, OrderBy: [b]}")
    await drm.tick()
    assert [await drm.state(i) for i in "abc"] == [
        S.DEMAND_STATE_ALLOCATED,
        S.DEMAND_STATE_ACCEPTED,
        S.DEMAND_STATE_ACCEPTED,
    ]
    for current, following in (("a", "b"), ("b", "c")):
        ticket = (await drm.claim(current)).ticket
        await drm.tick()
        assert await drm.state(following) == S.DEMAND_STATE_ACCEPTED  # not before it FINISHES
        await drm.release(ticket.ticket_id)
        await drm.tick()
        assert await drm.state(current) == S.DEMAND_STATE_FINISHED
        await drm.tick()
        assert await drm.state(following) == S.DEMAND_STATE_ALLOCATED
    await drm.consistent()


async def test_order_by_on_a_failed_demand_fails(drm):
    await drm.submit("a", 1)
    await drm.stub.CancelDemand(dpb.CancelDemandRequest(demand_id="a", reason="changed my mind"))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await drm.submit("b", 1, "{OrderBy: a}")
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "a FAILED" in exc.value.details()
    await drm.submit("c", 1, "{OrderBy: {OR: [a, x]}}")  # x may still finish
    await drm.submit("x", 1)
    await drm.stub.CancelDemand(dpb.CancelDemandRequest(demand_id="x"))
    await drm.tick()
    c = await drm.get("c")
    assert c.state == S.DEMAND_STATE_FAILED and "OrderBy can no longer be satisfied" in c.reason


async def test_order_by_cycles_are_refused(drm):
    await drm.submit("a", 1, "{OrderBy: b}")  # b does not exist yet: a waits for it
    await drm.submit("c", 1, "{OrderBy: a}")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await drm.submit("b", 1, "{OrderBy: {OR: [x, c]}}")
    code, message, details = rpc_error(exc)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "OrderBy makes a cycle: b -> c -> a -> b" in message
    assert details[0].reason == "ORDER_BY_CYCLE"
    err = await refused(
        drm.submit("self", 1, "{OrderBy: self}"), grpc.StatusCode.INVALID_ARGUMENT, "ORDER_BY_CYCLE"
    )
    assert "self -> self" in (err.details() or "")


async def test_unclaimed_allocation_is_released_and_failed(drm):
    await drm.submit("d", 2)
    await drm.tick()
    d = await drm.get("d")
    assert d.state == S.DEMAND_STATE_ALLOCATED
    # The claim timeout counts from allocate_time (when the allocation became visible).
    expires = d.claim_expire_time.ToDatetime(tzinfo=drm.clock.now().tzinfo)
    assert expires == d.allocate_time.ToDatetime(tzinfo=expires.tzinfo) + timedelta(seconds=CLAIM)
    await drm.tick((expires - drm.clock.now()).total_seconds() - 1)
    assert await drm.state("d") == S.DEMAND_STATE_ALLOCATED
    await drm.tick(ROUND)
    failed = await drm.get("d")
    assert failed.state == S.DEMAND_STATE_FAILED and "claim timeout" in failed.reason
    ticket = await drm.rm.rm.GetTicket(rpb.GetTicketRequest(ticket_id=d.ticket_id))
    assert ticket.ticket.state == rpb.TICKET_STATE_RELEASED
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await drm.claim("d")
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await drm.consistent()


async def test_admission_refused_when_two_demands_overlap_beyond_capacity(drm):
    await drm.submit("one", 3, "{Start: [+10m, +20m], Duration: +30m}")
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await drm.submit("two", 3, "{Start: [+15m, +10m], Duration: +30m}")
    code, message, details = rpc_error(exc)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no room" in message and "requested 3Gi, available 1Gi" in message
    info, quota = details[0], details[1]
    assert info.reason == "DEMAND_NOT_ADMITTED"
    assert quota.violations[0].subject.endswith("/memory_bytes")
    # Refused demands are not stored; ones that fit beside it, or after it, are accepted.
    await refused(drm.get("two"), grpc.StatusCode.NOT_FOUND)
    await drm.submit("three", 1, "{Start: [+15m, +10m], Duration: +30m}")
    await drm.submit("four", 3, "{Start: [+45m, +5m], Duration: +30m}")


async def test_cancel_returns_reservation_and_ticket(drm):
    await drm.submit("r", 3, "{Start: [+1m, ]}")
    await drm.tick()
    assert await drm.state("r") == S.DEMAND_STATE_ALLOCATING
    assert await plain_apply(drm, 2) is None
    cancelled = await drm.stub.CancelDemand(dpb.CancelDemandRequest(demand_id="r", reason="x"))
    assert cancelled.demand.state == S.DEMAND_STATE_FAILED and cancelled.demand.reason == (
        "cancelled: x"
    )
    again = await drm.stub.CancelDemand(dpb.CancelDemandRequest(demand_id="r"))
    assert again.demand.state == S.DEMAND_STATE_FAILED
    assert await plain_apply(drm, 2) is not None
    await drm.consistent()


async def test_cancel_returns_the_reservation_on_an_ecm_that_changed_type(drm):
    # An ECM without live tickets may re-register with another resource type: the
    # reservation a demand holds on its record was made in the old type, and still
    # comes off when the demand ends (it used to stay there for good).
    ecm = "emInstance=host7:9000"
    await drm.rm.rm.RegisterEcm(register("host7:9000", load(8 * GiB, 8000)))
    await drm.stub.SubmitDemand(
        dpb.SubmitDemandRequest(
            demand_id="e",
            labels=lbl(f"{USER},{ecm}"),
            resource=load(3 * GiB, 100),
            user="alice",
            time_conditions_text="{Start: [+1m, ]}",
        )
    )
    await drm.tick()
    assert await drm.state("e") == S.DEMAND_STATE_ALLOCATING
    assert (await label_state(drm.rm, ecm)).HasField("reserved_resource")
    memory = resource_pb2.Resource(memory=resource_pb2.MemoryResource(memory_bytes=8 * GiB))
    await drm.rm.rm.RegisterEcm(register("host7:9000", memory))
    await drm.stub.CancelDemand(dpb.CancelDemandRequest(demand_id="e"))
    assert not (await label_state(drm.rm, ecm)).HasField("reserved_resource")
    assert await drm.manager.check_reservations() == []


# ----- the interface ---------------------------------------------------------------------------


async def test_submit_is_idempotent_by_demand_id(drm):
    first = await drm.submit("same", 1, "{Start: [NOW, +5m], Duration: +20m}")
    structured = dpb.TimeConditions(
        start=dpb.StartCondition(
            time=dpb.TimeExpression(
                interval=dpb.TimeInterval(
                    begin=dpb.TimePoint(now=True), end=dpb.TimePoint(relative=Duration(seconds=300))
                )
            )
        ),
        duration=dpb.DurationCondition(duration=Duration(seconds=1200)),
    )
    await drm.tick()
    again = await drm.submit("same", 1, time_conditions=structured)  # the same, structured
    assert not again.created
    assert again.demand.demand_id == "same" and again.demand.submit_time == first.demand.submit_time
    assert again.demand.time_conditions_text == (
        "{Start: {Time: [NOW, +5m], Strategy: strict}, Duration: {Time: +20m, Strategy: loose}}"
    )
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await drm.submit("same", 1, "{Start: [NOW, +6m]}")
    code, _, details = rpc_error(exc)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details[0].reason == "DEMAND_ID_REUSED"


@pytest.mark.parametrize(
    ("text", "where", "expected"),
    [
        ("{Start: [NOW +5m]}", "line 1, column 14", "expected ',' or ']'"),
        ("{Start: [^3, NOW]}", "line 1, column 10", "^N is only allowed as the end T2"),
        ("{Start: {Time: [NOW, +5m],\n Strat: loose}}", "line 2, column 2", "a field name"),
        ("{DemandID: other}", "", "DemandID other does not match demand_id bad"),
    ],
)
async def test_malformed_conditions_are_invalid_argument_with_field_and_position(
    drm, text, where, expected
):
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await drm.submit("bad", 1, text)
    code, message, details = rpc_error(exc)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert where in message and expected in message
    violation = details[1].field_violations[0]
    assert violation.field in ("time_conditions_text", "time_conditions")
    assert expected in violation.description


async def test_malformed_structured_conditions_name_the_field_path(drm):
    bad = dpb.TimeConditions(
        start=dpb.StartCondition(
            time=dpb.TimeExpression(
                any_of=dpb.TimeExpressionList(
                    expressions=[
                        dpb.TimeExpression(interval=dpb.TimeInterval()),
                        dpb.TimeExpression(
                            interval=dpb.TimeInterval(begin=dpb.TimePoint(rounds=3))
                        ),
                    ]
                )
            )
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await drm.submit("bad", 1, time_conditions=bad)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "time_conditions.start.time.any_of.expressions[1].interval.begin.rounds"
        in exc.value.details()
    )


async def test_list_filters_and_pages(drm):
    for i in range(5):
        await drm.submit(f"p{i}", 0.1, "{Start: [+1h, ]}")
    await drm.stub.CancelDemand(dpb.CancelDemandRequest(demand_id="p3"))
    seen, token = [], ""
    while True:
        page = await drm.stub.ListDemands(dpb.ListDemandsRequest(page_size=2, page_token=token))
        seen += [d.demand_id for d in page.demands]
        token = page.next_page_token
        if not token:
            break
    assert seen == ["p0", "p1", "p2", "p3", "p4"]
    failed = await drm.stub.ListDemands(dpb.ListDemandsRequest(state=S.DEMAND_STATE_FAILED))
    assert [d.demand_id for d in failed.demands] == ["p3"]
    assert not (await drm.stub.ListDemands(dpb.ListDemandsRequest(user="bob"))).demands
    assert len((await drm.stub.ListDemands(dpb.ListDemandsRequest(user="alice"))).demands) == 5


# ----- randomized --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [5, 11, 23])
async def test_random_demands_and_ticks_never_overcommit_or_misallocate(drm, seed):
    """Many demands, ordinary applies and releases, random clock steps, and a second
    planner (another replica) racing the first: at every instant no label is
    over-committed, reservations add up, and each demand is allocated at most once,
    inside its window (or its slip bound when loose)."""
    rng = random.Random(seed)
    other = replace(drm.planner)  # a second replica's planner on the same database
    t0 = drm.clock.now()
    specs: dict[str, str] = {}
    for i in range(24):
        start = rng.randint(0, 40)
        length = rng.randint(0, 10)
        strategy = rng.choice(["strict", "loose"])
        end = f"^{rng.randint(0, 3)}" if rng.random() < 0.25 else f"+{length}m"
        text = (
            f"{{Start: {{Time: [+{start}m, {end}], Strategy: {strategy}}},"
            f" Duration: +{rng.randint(1, 15)}m}}"
        )
        try:
            await drm.submit(f"r{i:02d}", rng.choice([0.5, 1, 2]), text)
            specs[f"r{i:02d}"] = text
        except grpc.aio.AioRpcError as err:
            assert err.code() in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.FAILED_PRECONDITION,
            )
    assert len(specs) >= 5
    ordinary: list[str] = []
    seen_tickets: dict[str, str] = {}
    for _ in range(60):
        drm.clock.advance(rng.choice([5, 10, 20, 45, 90]))
        await drm.planner.tick() if rng.random() < 0.5 else await _race(drm.planner, other)
        if rng.random() < 0.4:
            ticket = await plain_apply(drm, rng.choice([0.5, 1]))
            if ticket is not None:
                ordinary.append(ticket.ticket_id)
        if ordinary and rng.random() < 0.4:
            await drm.release(ordinary.pop(rng.randrange(len(ordinary))))
        listing = await drm.stub.ListDemands(dpb.ListDemandsRequest(page_size=100))
        for d in listing.demands:
            if d.state == S.DEMAND_STATE_ALLOCATED and rng.random() < 0.5:
                await drm.claim(d.demand_id)
            elif d.state == S.DEMAND_STATE_MONITORING and rng.random() < 0.3:
                await drm.release(d.ticket_id)
            if d.ticket_id:
                assert seen_tickets.setdefault(d.ticket_id, d.demand_id) == d.demand_id
        await drm.consistent()  # used + locked <= max everywhere, reservations add up
    outcomes = []
    for demand_id, text in specs.items():
        d = await drm.get(demand_id)
        outcomes.append((dpb.DemandState.Name(d.state), d.reason[:60], d.passed_over_rounds))
        allocations = [e for e in d.events if e.to_state == S.DEMAND_STATE_ALLOCATED]
        assert len(allocations) <= 1
        if not allocations:
            continue
        at = allocations[0].time.ToDatetime(tzinfo=t0.tzinfo)
        window: Any = resolve(parse(text).start.expr, t0)  # type: ignore[union-attr]
        if "strict" in text:
            assert holds(window, at, d.passed_over_rounds), (demand_id, text, at)
        else:
            assert isinstance(window, Span) or window.lo is not None
            lo = window.lo if window.lo is not None else t0
            assert lo <= at, (demand_id, text, at)
            if isinstance(window, Span) and window.hi is not None:
                assert at <= window.hi + timedelta(seconds=SLIP), (demand_id, text, at)
    assert any(state == "DEMAND_STATE_FINISHED" for state, _, _ in outcomes)


async def _race(a: DemandPlanner, b: DemandPlanner) -> None:
    import asyncio

    await asyncio.gather(a.tick(), b.tick())


# ----- rmctl -------------------------------------------------------------------------------------


async def test_rmctl_demand_commands(drm):
    import argparse
    import asyncio
    import io

    from labelrm_client._errors import InvalidArgument as ClientInvalidArgument
    from labelrm_client._impl import RMClient
    from rmctl.demand import EXAMPLE, register

    parser = argparse.ArgumentParser()
    parser.add_argument("-o", "--output", default="table")
    register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> str:
        args = parser.parse_args(argv)
        out = io.StringIO()
        with RMClient(drm.rm.target) as client:
            assert args.func(client, args, out) == 0
        return out.getvalue()

    async def rmctl(*argv: str) -> str:  # the sync client must not block the server's loop
        return await asyncio.to_thread(run, *argv)

    submit = ("demand", "submit", "1234", "--labels", USER, "--memory", "1Gi", "--cpu", "100m")
    text = await rmctl(*submit, "--user", "alice", "--when", EXAMPLE)
    assert text.startswith("submitted: 1234 ACCEPTED")
    assert "OrderBy: 1200" in text
    assert "already submitted" in await rmctl(*submit, "--user", "alice", "--when", EXAMPLE)
    listing = await rmctl("demand", "list", "--state", "accepted")
    assert "1234" in listing and "DEMAND_ID" in listing.splitlines()[0]
    shown = await rmctl("demand", "show", "1234")
    assert "conditions" in shown and "NEW" in shown and "ACCEPTED" in shown
    assert '"demand_id": "1234"' in await rmctl("-o", "json", "demand", "show", "1234")
    assert "FAILED: cancelled: not needed" in await rmctl(
        "demand", "cancel", "1234", "--reason", "not needed"
    )
    with pytest.raises(ClientInvalidArgument, match="line 1, column 14"):
        await rmctl(*[a if a != "1234" else "x" for a in submit], "--when", "{Start: [NOW +5m]}")
