"""Applies that wait for capacity: woken by releases (LISTEN/NOTIFY), FIFO per label."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_pb2

from tests.support.env import BOTH_PATHS
from tests.support.messages import GiB, apply_req, limit_req, load, load_instance, register
from tests.support.rm import assert_consistent
from tests.support.waiting import wait_until

pytestmark = BOTH_PATHS

USER = "userCreator=alice-IDE,engineType=spark-3.2.1"
ECM = "host1:9000"
ALICE = f"{USER},emInstance={ECM}"
BOB = f"userCreator=bob-IDE,engineType=spark-3.2.1,emInstance={ECM}"
ONE = load_instance(GiB, 100, 1)


async def waiters(rm) -> int:
    async def count(conn):
        cur = await conn.execute("SELECT count(DISTINCT seq) FROM apply_waiter")
        return (await cur.fetchone())[0]

    n: int = await rm.core.db.run(count)
    return n


async def test_waiting_apply_is_granted_by_a_release(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    holder = (await rm.rm.Apply(apply_req(USER, load(3 * GiB, 100)))).ticket
    waiting = asyncio.ensure_future(rm.rm.Apply(apply_req(USER, load(2 * GiB, 100), wait=60)))
    await wait_until(lambda: waiters(rm), timeout=10)
    assert not waiting.done()
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=holder.ticket_id))
    granted = await asyncio.wait_for(waiting, timeout=30)
    assert granted.ticket.state == pb.TICKET_STATE_LOCKED
    assert await waiters(rm) == 0
    await assert_consistent(rm)


async def test_waiting_apply_times_out_with_deadline_exceeded(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(GiB, 4000)))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.Apply(apply_req(USER, load(2 * GiB, 100), wait=0.5))
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    status = rpc_status.from_call(exc.value)
    assert any(d.Is(resource_pb2.Shortfalls.DESCRIPTOR) for d in status.details)
    assert await waiters(rm) == 0
    records = await rm.rm.ListLabelResources(pb.ListLabelResourcesRequest())
    assert all(r.live_tickets == 0 for r in records.label_resources)


async def test_large_waiter_is_not_overtaken_by_later_small_requests(rm):
    """On a shared label (an ECM), a waiter holds what it waits for back from later
    requests of other users, waiting or not (docs/architecture.md, "Waiting applies
    and fairness")."""
    await rm.rm.RegisterEcm(register(ECM, load_instance(4 * GiB, 4000, 8)))
    small = [(await rm.rm.Apply(apply_req(ALICE, ONE))).ticket for _ in range(3)]
    big = asyncio.ensure_future(
        rm.rm.Apply(apply_req(BOB, load_instance(3 * GiB, 100, 1), wait=60))
    )
    await wait_until(lambda: waiters(rm), timeout=10)
    # One GiB is free, but the big waiter is first in line: a new small request must
    # not take it, neither at once nor by waiting.
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.Apply(apply_req(ALICE, ONE))
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queued behind" in exc.value.details()
    late_small = asyncio.ensure_future(rm.rm.Apply(apply_req(ALICE, ONE, wait=60)))
    await wait_until(lambda: _eq(waiters(rm), 2), timeout=10)
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=small[0].ticket_id))
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=small[1].ticket_id))
    granted_big = await asyncio.wait_for(big, timeout=30)
    assert granted_big.ticket.state == pb.TICKET_STATE_LOCKED
    assert not late_small.done()
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=small[2].ticket_id))
    granted_small = await asyncio.wait_for(late_small, timeout=30)
    assert (
        granted_small.ticket.create_time.ToNanoseconds()
        >= granted_big.ticket.create_time.ToNanoseconds()
    )
    await assert_consistent(rm)


async def test_a_users_waiter_does_not_hold_back_their_own_quota(rm):
    """Within one user's own quota label nobody else is held back, so no hold: the
    user's later request that fits is granted (their big waiter keeps waiting)."""
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    await rm.rm.Apply(apply_req(USER, load(3 * GiB, 100)))
    big = asyncio.ensure_future(rm.rm.Apply(apply_req(USER, load(3 * GiB, 100), wait=60)))
    await wait_until(lambda: waiters(rm), timeout=10)
    fits = await rm.rm.Apply(apply_req(USER, load(GiB, 100)))
    assert fits.ticket.state == pb.TICKET_STATE_LOCKED
    assert not big.done()
    big.cancel()
    with pytest.raises(asyncio.CancelledError):
        await big
    await assert_consistent(rm)


async def _eq(awaitable: Awaitable[Any], expected: Any) -> bool:
    return bool((await awaitable) == expected)


async def test_cancelled_waiter_leaves_the_queue(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(GiB, 4000)))
    call = rm.rm.Apply(apply_req(USER, load(2 * GiB, 100), wait=60))
    task = asyncio.ensure_future(call)
    await wait_until(lambda: waiters(rm), timeout=10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: _eq(waiters(rm), 0), timeout=10)
    ok = await rm.rm.Apply(apply_req(USER, load(GiB, 100)))
    assert ok.ticket.state == pb.TICKET_STATE_LOCKED
