"""Concurrent Apply / ReportUsed / Release share transactions (rm_server/app/batching.py,
rm_server/store/tickets.py): each request stays all-or-nothing, in arrival order, FIFO
behind waiters, idempotent, and every invariant holds.

Some tests compose groups by hand (core.tickets._run_group) to pin down the order inside one
transaction; the others drive the real server concurrently."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import timedelta

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb

from rm_server.domain.labels import Label
from rm_server.domain.model import Refusal, Ticket, TicketState
from rm_server.domain.resources import Resource
from rm_server.domain.ticket_group import NeedsRows
from rm_server.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from rm_server.service.resource_manager import _TICKET_ENCODERS
from rm_server.store import ticket_ops
from rm_server.store import tickets as ticket_store
from rm_server.store import waiters as waiter_store
from rm_server.store.db import Idempotency, Replay
from tests.support.env import BOTH_PATHS
from tests.support.messages import GiB, apply_req, limit_req, load, load_instance, register
from tests.support.rm import assert_consistent, label_state, start_in_process, stop_in_process

pytestmark = BOTH_PATHS

USER = "userCreator=alice-IDE,engineType=spark-3.2.1"
BOB = "userCreator=bob-IDE,engineType=spark-3.2.1"


def _labels(text: str) -> tuple[Label, ...]:
    return tuple(Label(*p.split("=", 1)) for p in text.split(","))


def apply_op(rm, labels: str, resource: Resource, *, rid: str = "", seq=None):
    lbls = _labels(labels)
    rid = rid or uuid.uuid4().hex
    return ticket_ops.ApplyOp(
        Idempotency.of("Apply", rid, f"{labels}|{resource}".encode()),
        _TICKET_ENCODERS["Apply"],
        f"t-{uuid.uuid4().hex}",
        "",
        lbls,
        rm.core.tickets.charged_keys(lbls),
        resource,
        timedelta(seconds=60),
        seq,
    )


def report_op(ticket_id: str, used: Resource | None = None, rid: str = ""):
    rid = rid or uuid.uuid4().hex
    return ticket_ops.ReportOp(
        Idempotency.of("ReportUsed", rid, f"{ticket_id}|{used}".encode()),
        _TICKET_ENCODERS["ReportUsed"],
        ticket_id,
        used,
    )


def release_op(ticket_id: str, rid: str = ""):
    rid = rid or uuid.uuid4().hex
    return ticket_ops.ReleaseOp(
        Idempotency.of("Release", rid, ticket_id.encode()),
        _TICKET_ENCODERS["Release"],
        ticket_id,
    )


async def waiter(rm, labels: str, resource: Resource) -> int:
    """Queue a waiter for `resource` (user "waiter"), holding for a minute."""
    keys = rm.core.tickets.charged_keys(_labels(labels))
    hold = rm.core.clock.now() + timedelta(seconds=60)
    seq: int = await rm.core.tickets._join_queue(
        f"w-{uuid.uuid4().hex}", keys, 60, "waiter", resource, hold
    )
    return seq


# A shared label (an ECM's): waiters hold capacity back there, not on a user's own quota.
SHARED = "emInstance=host9:9000"


def shared(memory: int) -> Resource:
    return Resource.load_instance(memory, 100, 1)


async def test_a_group_runs_in_arrival_order_each_all_or_nothing(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(3 * GiB, 4000)))
    for who in (USER, BOB):  # the labels' records exist from here
        await rm.rm.Apply(apply_req(who, load(1, 1)))
    # 3 GiB in all: the first two fit, the third does not and changes nothing, the
    # fourth (other user) fits; a kind mismatch is refused without touching anything.
    ops = [
        apply_op(rm, USER, Resource.load(GiB, 100)),
        apply_op(rm, USER, Resource.load(GiB, 100)),
        apply_op(rm, USER, Resource.load(2 * GiB, 100)),
        apply_op(rm, USER, Resource.special({"gpu": 1})),
        apply_op(rm, BOB, Resource.load(2 * GiB, 100)),
    ]
    out = await rm.core.tickets._run_group(ops)
    assert isinstance(out[0], Ticket) and isinstance(out[1], Ticket)
    assert isinstance(out[2], Refusal)  # a value: the caller refuses it, or waits
    assert [(s.requested, s.available) for s in out[2].shortfalls] == [(2 * GiB, GiB - 1)]
    assert isinstance(out[3], InvalidArgument)
    assert isinstance(out[4], Ticket)
    state = await label_state(rm, USER)
    assert state.locked_resource.load.memory_bytes == 2 * GiB + 1
    assert state.live_tickets == 3
    # Neither the refusal (transient: a retry may fit) nor the invalid request (it
    # changed nothing) was stored with its request id; the grant was.
    again = await rm.core.tickets._run_group([ops[2], ops[3], ops[0]])
    assert isinstance(again[0], Refusal)
    assert isinstance(again[1], InvalidArgument)
    assert isinstance(again[2], Replay) and again[2].status_code == 0
    await assert_consistent(rm)


async def test_waiters_keep_fifo_inside_a_group(rm):
    await rm.rm.RegisterEcm(register("host9:9000", load_instance(2 * GiB, 4000, 8)))
    held = (await rm.rm.Apply(apply_req(SHARED, load_instance(2 * GiB, 100, 1)))).ticket
    seq = await waiter(rm, SHARED, shared(3 * GiB // 2))
    # One group: the release frees 2 GiB; a newcomer that would fit is behind the
    # waiter (which holds 1.5 GiB back); the waiter takes its 1.5 GiB; another newcomer,
    # behind no one now, takes the rest.
    ops = [
        release_op(held.ticket_id),
        apply_op(rm, SHARED, shared(GiB)),
        apply_op(rm, SHARED, shared(3 * GiB // 2), seq=seq),
        apply_op(rm, SHARED, shared(GiB // 2)),
    ]
    out = await rm.core.tickets._run_group(ops)
    assert isinstance(out[0], Ticket) and out[0].state is TicketState.RELEASED
    assert isinstance(out[1], Refusal) and out[1].queued_behind == (SHARED,)
    assert isinstance(out[2], Ticket) and out[2].state is TicketState.LOCKED
    assert isinstance(out[3], Ticket)

    async def waiting(conn):
        cur = await conn.execute("SELECT count(*) FROM apply_waiter")
        return (await cur.fetchone())[0]

    assert await rm.core.db.run(waiting) == 0  # the served waiter left the queue
    await assert_consistent(rm)


async def test_a_waiter_that_still_does_not_fit_must_wait_and_changes_nothing(rm):
    await rm.rm.RegisterEcm(register("host9:9000", load_instance(2 * GiB, 4000, 8)))
    await rm.rm.Apply(apply_req(SHARED, load_instance(GiB, 100, 1)))
    seq = await waiter(rm, SHARED, shared(2 * GiB))
    ops = [
        apply_op(rm, SHARED, shared(2 * GiB), seq=seq),
        apply_op(rm, SHARED, shared(GiB)),  # behind the waiter
    ]
    out = await rm.core.tickets._run_group(ops)
    assert isinstance(out[0], Refusal)  # it waits on
    assert isinstance(out[1], Refusal) and out[1].queued_behind == (SHARED,)
    state = await label_state(rm, SHARED)
    assert state.live_tickets == 1
    await rm.core.db.run(lambda c: waiter_store.remove_waiter(c, seq))
    await assert_consistent(rm)


async def test_report_release_and_unknown_tickets_in_one_group(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(8 * GiB, 4000)))
    a = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    b = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    released = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=released.ticket_id))
    ops = [
        report_op(a.ticket_id, Resource.load(GiB // 2, 100)),  # part of the lock freed
        release_op(a.ticket_id),
        report_op(a.ticket_id),  # ended just before, in this group
        release_op(a.ticket_id),  # idempotent
        report_op(b.ticket_id, Resource.load(2 * GiB, 100)),  # more than locked
        report_op(released.ticket_id),  # ended in an earlier transaction
        release_op(released.ticket_id),
        release_op("t-nope"),
        report_op("t-nope"),
    ]
    out = await rm.core.tickets._run_group(ops)
    assert isinstance(out[0], Ticket) and out[0].state is TicketState.USED
    assert isinstance(out[1], Ticket) and out[1].state is TicketState.RELEASED
    assert isinstance(out[2], FailedPrecondition) and out[2].reason == "TICKET_ENDED"
    assert isinstance(out[3], Ticket) and out[3].state is TicketState.RELEASED
    assert isinstance(out[4], FailedPrecondition) and out[4].reason == "USED_EXCEEDS_LOCKED"
    assert isinstance(out[5], FailedPrecondition) and out[5].reason == "TICKET_ENDED"
    assert isinstance(out[6], Ticket) and out[6].state is TicketState.RELEASED
    assert isinstance(out[7], NotFound) and isinstance(out[8], NotFound)
    state = await label_state(rm, USER)
    assert state.live_tickets == 1 and state.locked_resource.load.memory_bytes == GiB
    await assert_consistent(rm)


async def test_expired_lock_is_reclaimed_by_a_grouped_report(rm_manual_clock):
    rm = rm_manual_clock
    t = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    rm.clock.advance(120)  # past the 60 s lock timeout
    other = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    out = await rm.core.tickets._run_group([report_op(t.ticket_id), report_op(other.ticket_id)])
    assert isinstance(out[0], FailedPrecondition) and out[0].reason == "LOCK_EXPIRED"
    assert isinstance(out[1], Ticket) and out[1].state is TicketState.USED
    got = await rm.rm.GetTicket(pb.GetTicketRequest(ticket_id=t.ticket_id))
    assert got.ticket.state == pb.TICKET_STATE_EXPIRED
    await assert_consistent(rm)


async def test_labels_with_a_limit_but_no_record_get_one_first(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=carol-*,engineType=*", load(GiB, 1000)))
    carol = "userCreator=carol-IDE,engineType=spark-3.2.1"
    out = await rm.core.tickets._run_group(
        [apply_op(rm, carol, Resource.load(GiB, 100)), apply_op(rm, USER, Resource.load(GiB, 1))]
    )
    assert isinstance(out[0], NeedsRows) and out[0].labels == (carol,)
    assert isinstance(out[1], Ticket)  # no record and no limit: nothing to check, skipped
    # Through the server the row is created and the apply retried.
    ok = await rm.rm.Apply(apply_req(carol, load(GiB, 100)))
    assert ok.ticket.state == pb.TICKET_STATE_LOCKED
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.Apply(apply_req(carol, load(1, 1)))
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await assert_consistent(rm)


async def test_hot_label_under_concurrency_is_shared_exactly(rm, grouping):
    """Every request names the same label with room for exactly 20: 20 granted, the
    rest refused (grouped: in far fewer transactions than requests)."""
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(20 * GiB, 100000)))
    results = await asyncio.gather(
        *(rm.rm.Apply(apply_req(USER, load(GiB, 1))) for _ in range(60)), return_exceptions=True
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(granted) == 20 and len(refused) == 40
    assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused)
    combiner = rm.core.tickets._combiner
    if grouping:
        assert combiner is not None and combiner.groups < combiner.requests
    else:
        assert combiner is None
    # Report and release all of them concurrently too.
    await asyncio.gather(
        *(rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=g.ticket.ticket_id)) for g in granted)
    )
    await asyncio.gather(
        *(rm.rm.Release(pb.ReleaseRequest(ticket_id=g.ticket.ticket_id)) for g in granted)
    )
    state = await label_state(rm, USER)
    assert state.live_tickets == 0 and state.used_resource.load.memory_bytes == 0
    await assert_consistent(rm)


async def test_duplicate_request_ids_never_share_a_group(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(64 * GiB, 4000)))
    reqs = [apply_req(USER, load(GiB, 1), request_id="dup") for _ in range(10)]
    reqs += [apply_req(USER, load(GiB, 1), request_id=f"u{i}") for i in range(10)]
    results = await asyncio.gather(*(rm.rm.Apply(r) for r in reqs))
    assert len({r.ticket.ticket_id for r in results[:10]}) == 1
    state = await label_state(rm, USER)
    assert state.live_tickets == 11
    await assert_consistent(rm)


async def test_a_group_that_fails_as_a_whole_runs_its_requests_one_by_one(rm, monkeypatch):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(8 * GiB, 4000)))
    await rm.rm.Apply(apply_req(USER, load(1, 1)))
    bad = apply_op(rm, USER, Resource.load(GiB, 1))
    good = apply_op(rm, USER, Resource.load(GiB, 1))
    original = ticket_store.run

    async def run(conn, ops, now):
        if any(op is bad for op in ops):
            raise RuntimeError("the database refused something")
        return await original(conn, ops, now)

    monkeypatch.setattr(ticket_store, "run", run)
    out = await rm.core.tickets._run_group([good, bad])
    assert isinstance(out[0], Ticket)
    assert isinstance(out[1], RuntimeError)
    state = await label_state(rm, USER)
    assert state.live_tickets == 2
    await assert_consistent(rm)


async def test_grouping_off_uses_one_transaction_per_request(database_url):
    rm = await start_in_process(database_url)
    try:
        rm.core.settings = dataclasses.replace(rm.core.settings, batch_max=0)
        await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(5 * GiB, 4000)))
        results = await asyncio.gather(
            *(rm.rm.Apply(apply_req(USER, load(GiB, 1))) for _ in range(8)),
            return_exceptions=True,
        )
        assert sum(not isinstance(r, BaseException) for r in results) == 5
        assert rm.core.tickets._combiner is None
        for r in results:
            if not isinstance(r, BaseException):
                await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=r.ticket.ticket_id))
                await rm.rm.Release(pb.ReleaseRequest(ticket_id=r.ticket.ticket_id))
        await assert_consistent(rm)
    finally:
        await stop_in_process(rm)


async def test_same_request_id_on_two_replicas_charges_once(rm, grouping_overrides):
    """Two replicas group the same request id in their own transactions: the second
    to commit hits the request_log key, retries, and replays the first's outcome."""
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(64 * GiB, 4000)))
    other = await start_in_process(rm.database_url, **grouping_overrides)
    try:
        for n in range(5):
            reqs = [apply_req(USER, load(GiB, 1), request_id=f"twice-{n}")] * 6
            fillers = [apply_req(USER, load(1, 1)) for _ in range(6)]
            results = await asyncio.gather(
                *(rm.rm.Apply(r) for r in reqs + fillers),
                *(other.rm.Apply(r) for r in reqs + fillers),
            )
            ids = {r.ticket.ticket_id for r in results[:6]} | {
                r.ticket.ticket_id for r in results[12:18]
            }
            assert len(ids) == 1
        state = await label_state(rm, USER)
        assert state.live_tickets == 5 + 5 * 12
        await assert_consistent(rm)
    finally:
        await stop_in_process(other)
