"""Request-id idempotency and lock expiry (with an injected clock: no real waiting)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb

from tests.support.env import BOTH_PATHS
from tests.support.messages import GiB, apply_req, limit_req, load
from tests.support.rm import assert_consistent, label_state

pytestmark = BOTH_PATHS

USER = "userCreator=alice-IDE,engineType=spark-3.2.1"


async def test_retry_with_same_request_id_charges_once(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    first = await rm.rm.Apply(apply_req(USER, load(GiB, 100), request_id="req-1"))
    again = await rm.rm.Apply(apply_req(USER, load(GiB, 100), request_id="req-1"))
    assert again.ticket == first.ticket
    state = await label_state(rm, USER)
    assert state.locked_resource.load.memory_bytes == GiB
    assert state.live_tickets == 1
    # Concurrent duplicates: exactly one charge.
    results = await asyncio.gather(
        *(rm.rm.Apply(apply_req(USER, load(GiB, 100), request_id="req-2")) for _ in range(8))
    )
    assert len({r.ticket.ticket_id for r in results}) == 1
    state = await label_state(rm, USER)
    assert state.locked_resource.load.memory_bytes == 2 * GiB
    await assert_consistent(rm)


async def test_refusal_is_answered_afresh_for_the_same_request_id(rm):
    # RESOURCE_EXHAUSTED is transient: not stored, each retry is decided again.
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(GiB, 4000)))
    for available in ("1Gi", "512Mi"):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await rm.rm.Apply(apply_req(USER, load(2 * GiB, 100), request_id="big"))
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"requested 2Gi, available {available}" in exc.value.details()
        await rm.rm.Apply(apply_req(USER, load(GiB // 2, 100)))


async def test_request_id_reused_with_another_request_is_invalid(rm):
    await rm.rm.Apply(apply_req(USER, load(1, 1), request_id="same"))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.Apply(apply_req(USER, load(2, 1), request_id="same"))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request_id" in exc.value.details()


async def test_report_and_release_retries_return_first_outcome(rm):
    t = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    r1 = await rm.rm.ReportUsed(pb.ReportUsedRequest(request_id="rep", ticket_id=t.ticket_id))
    r2 = await rm.rm.ReportUsed(pb.ReportUsedRequest(request_id="rep", ticket_id=t.ticket_id))
    assert r1 == r2
    x1 = await rm.rm.Release(pb.ReleaseRequest(request_id="rel", ticket_id=t.ticket_id))
    x2 = await rm.rm.Release(pb.ReleaseRequest(request_id="rel", ticket_id=t.ticket_id))
    assert x1 == x2


async def test_request_ids_are_kept_for_the_retention_period(rm_manual_clock):
    rm = rm_manual_clock
    await rm.rm.Apply(apply_req(USER, load(1, 1), request_id="old"))
    rm.clock.advance(24 * 3600)
    await rm.core.sweeps.sweep()
    replay = await rm.rm.Apply(apply_req(USER, load(1, 1), request_id="old"))
    assert replay.ticket.create_time.ToDatetime().year == 2026  # still the first outcome
    rm.clock.advance(25 * 3600)  # now 49 h: past the 48 h retention
    await rm.core.sweeps.sweep()
    fresh = await rm.rm.Apply(apply_req(USER, load(1, 1), request_id="old"))
    assert fresh.ticket.ticket_id != replay.ticket.ticket_id


async def test_locked_ticket_expires_and_its_resource_returns(rm_manual_clock):
    rm = rm_manual_clock
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    stale = (await rm.rm.Apply(apply_req(USER, load(3 * GiB, 100)))).ticket
    used = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=used.ticket_id))
    rm.clock.advance(59)
    assert await rm.core.sweeps.sweep() == 0
    rm.clock.advance(2)  # past the 60 s lock timeout
    assert await rm.core.sweeps.sweep() == 1
    got = await rm.rm.GetTicket(pb.GetTicketRequest(ticket_id=stale.ticket_id))
    assert got.ticket.state == pb.TICKET_STATE_EXPIRED
    state = await label_state(rm, USER)
    assert state.locked_resource.load.memory_bytes == 0
    assert state.used_resource.load.memory_bytes == GiB  # USED tickets never expire
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=stale.ticket_id))
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "EXPIRED" in exc.value.details()
    await assert_consistent(rm)


async def test_late_report_before_the_sweep_is_refused_and_reclaims(rm_manual_clock):
    rm = rm_manual_clock
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    t = (await rm.rm.Apply(apply_req(USER, load(3 * GiB, 100)))).ticket
    rm.clock.advance(61)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=t.ticket_id))
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    state = await label_state(rm, USER)
    assert state.locked_resource.load.memory_bytes == 0
    assert state.live_tickets == 0
    await assert_consistent(rm)


async def test_ended_tickets_are_kept_for_the_history_retention(rm_manual_clock):
    rm = rm_manual_clock
    live = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=live.ticket_id))
    old = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=old.ticket_id))
    rm.clock.advance(20 * 86400)
    recent = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=recent.ticket_id))
    rm.clock.advance(11 * 86400)  # `old` ended 31 days ago, `recent` 11
    await rm.core.sweeps.sweep()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.GetTicket(pb.GetTicketRequest(ticket_id=old.ticket_id))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    got = await rm.rm.GetTicket(pb.GetTicketRequest(ticket_id=recent.ticket_id))
    assert got.ticket.state == pb.TICKET_STATE_RELEASED
    got = await rm.rm.GetTicket(pb.GetTicketRequest(ticket_id=live.ticket_id))
    assert got.ticket.state == pb.TICKET_STATE_USED  # live tickets never age out
    await assert_consistent(rm)


async def test_retention_keeps_up_with_more_ended_tickets_than_a_batch(rm_manual_clock):
    """A busy cluster ends more tickets per retention interval than one bounded DELETE
    removes: the sweep goes on at its next rounds (not an interval later) until none
    past the retention are left."""
    from rm_server.app.sweeps import PURGE_BATCH

    rm = rm_manual_clock
    now = rm.clock.now()
    old_end = now - timedelta(days=31)
    await rm.core.db.run(
        lambda c: c.execute(
            "INSERT INTO ticket_history (ticket_id, final_state, reason, user_name, labels,"
            " charged_labels, requested, created_at, ended_at)"
            " SELECT 'old-' || g, 'RELEASED', 'released', 'u', '[]', '{}', '{}', %s, %s"
            " FROM generate_series(1, %s) g",
            (old_end, old_end, 2 * PURGE_BATCH + 10),
        )
    )

    async def count(conn) -> int:
        cur = await conn.execute("SELECT count(*) FROM ticket_history WHERE ticket_id LIKE 'old-%'")
        return int((await cur.fetchone())[0])

    async def old_rows() -> int:
        n: int = await rm.core.db.run(count)
        return n

    rm.clock.advance(61)  # past the retention interval since the sweep at start-up
    rounds = 0
    while await old_rows() and rounds < 10:
        rm.clock.advance(1)  # one sweep interval, far less than the retention interval
        await rm.core.sweeps.sweep()
        rounds += 1
    assert await old_rows() == 0
    assert rounds <= 4
