"""Waiting applies are fair without freezing anyone (docs/architecture.md, "Waiting
applies and fairness"): a large waiter is not starved by a stream of small requests,
a waiter that can never be satisfied holds nothing back, and a dead replica's
waiters stop counting within seconds."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb

from tests.support.env import BOTH_PATHS
from tests.support.messages import GiB, apply_req, limit_req, load, load_instance, register
from tests.support.refusals import refused as refusal
from tests.support.rm import assert_consistent
from tests.support.waiting import wait_until

pytestmark = BOTH_PATHS

ECM = "host1:9000"
ALICE = f"userCreator=alice-IDE,engineType=spark-3.2.1,emInstance={ECM}"
BOB = f"userCreator=bob-IDE,engineType=spark-3.2.1,emInstance={ECM}"


async def waiters(rm) -> int:
    async with await _connect(rm) as conn:
        cur = await conn.execute("SELECT count(DISTINCT seq) FROM apply_waiter")
        row = await cur.fetchone()
        return int(row[0])


async def _connect(rm: Any) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(rm.database_url, autocommit=True)


async def test_a_large_waiter_gets_the_ecm_despite_a_stream_of_small_applies(rm):
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    held = [
        (await rm.rm.Apply(apply_req(ALICE, load_instance(GiB, 100, 1)))).ticket for _ in range(4)
    ]
    big = asyncio.ensure_future(
        rm.rm.Apply(apply_req(BOB, load_instance(6 * GiB, 100, 1), wait=60))
    )
    await wait_until(lambda: waiters(rm), timeout=10)
    # Alice keeps asking for small pieces and releasing the old ones: what is freed
    # goes to Bob's waiter, never back to Alice, until Bob fits.
    refused = 0
    for ticket in held:
        await rm.rm.Release(pb.ReleaseRequest(ticket_id=ticket.ticket_id))
        try:
            await rm.rm.Apply(apply_req(ALICE, load_instance(GiB, 100, 1)))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            refused += 1
        if big.done():
            break
    granted = await asyncio.wait_for(big, timeout=30)
    assert granted.ticket.state == pb.TICKET_STATE_LOCKED
    assert refused >= 1
    await assert_consistent(rm)


async def test_an_impossible_waiter_does_not_freeze_the_ecm(rm):
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    impossible = asyncio.ensure_future(
        rm.rm.Apply(apply_req(BOB, load_instance(GiB, 100, 16), wait=3600))
    )
    await wait_until(lambda: waiters(rm), timeout=10)
    fits = await rm.rm.Apply(apply_req(ALICE, load_instance(GiB, 100, 1)))
    assert fits.ticket.state == pb.TICKET_STATE_LOCKED
    assert not impossible.done()
    impossible.cancel()
    with pytest.raises(asyncio.CancelledError):
        await impossible
    await assert_consistent(rm)


async def test_a_waiter_over_its_own_quota_holds_nothing_on_the_ecm(rm):
    """Bob waits because of his own quota, which no other user's release can cure: his
    waiter must not hold back the ECM, so Alice's request that fits is granted."""
    await rm.admin.SetLabelLimit(limit_req("userCreator=bob-IDE,engineType=*", load(4 * GiB, 4000)))
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    await rm.rm.Apply(apply_req(BOB, load_instance(3 * GiB, 100, 1)))
    over_quota = asyncio.ensure_future(
        rm.rm.Apply(apply_req(BOB, load_instance(2 * GiB, 100, 1), wait=60))
    )
    await wait_until(lambda: waiters(rm), timeout=10)

    async def alice_granted() -> bool:
        try:
            await rm.rm.Apply(apply_req(ALICE, load_instance(5 * GiB, 100, 1)))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return False
        return True

    # The waiter gives its hold up on its first look after joining the queue.
    await wait_until(alice_granted, timeout=10, interval=0.1)
    assert not over_quota.done()
    over_quota.cancel()
    with pytest.raises(asyncio.CancelledError):
        await over_quota
    await assert_consistent(rm)


async def test_a_waiters_hold_is_bounded(database_url, grouping_overrides):
    from tests.support.rm import start_in_process, stop_in_process

    rm = await start_in_process(database_url, waiter_hold=1.0, **grouping_overrides)
    try:
        await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
        await rm.rm.Apply(apply_req(ALICE, load_instance(4 * GiB, 100, 1)))
        big = asyncio.ensure_future(
            rm.rm.Apply(apply_req(BOB, load_instance(6 * GiB, 100, 1), wait=60))
        )
        await wait_until(lambda: waiters(rm), timeout=10)

        async def small_granted() -> bool:
            try:
                await rm.rm.Apply(apply_req(ALICE, load_instance(GiB, 100, 1)))
            except grpc.aio.AioRpcError as exc:
                assert "queued behind" in (exc.details() or "")
                return False
            return True

        await wait_until(small_granted, timeout=20, interval=0.2)
        big.cancel()
        with pytest.raises(asyncio.CancelledError):
            await big
    finally:
        await stop_in_process(rm)


async def test_a_dead_replicas_waiter_stops_counting_within_seconds(rm_process_factory):
    first, second = rm_process_factory("--sweep-interval", "0.5"), rm_process_factory()
    first.start()
    second.start()
    from labelrm.v1 import resource_manager_pb2_grpc

    async with (
        grpc.aio.insecure_channel(first.target) as one,
        grpc.aio.insecure_channel(second.target) as two,
    ):
        survivor = resource_manager_pb2_grpc.ResourceManagerServiceStub(one)
        doomed = resource_manager_pb2_grpc.ResourceManagerServiceStub(two)
        await survivor.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
        await survivor.Apply(apply_req(ALICE, load_instance(4 * GiB, 100, 1)))
        waiting = asyncio.ensure_future(
            doomed.Apply(apply_req(BOB, load_instance(6 * GiB, 100, 1), wait=3600))
        )

        class _Db:
            database_url = first.database_url

        await wait_until(lambda: waiters(_Db), timeout=10)
        err = await refusal(
            survivor.Apply(apply_req(ALICE, load_instance(GiB, 100, 1))),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUEUED_BEHIND_WAITERS",
        )
        assert "queued behind" in (err.details() or "")
        second.kill()

        async def granted() -> bool:
            try:
                await survivor.Apply(apply_req(ALICE, load_instance(GiB, 100, 1)))
            except grpc.aio.AioRpcError:
                return False
            return True

        await wait_until(granted, timeout=15, interval=0.2)
        assert await waiters(_Db) == 0
        waiting.cancel()
