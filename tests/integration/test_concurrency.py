"""Concurrency and failure: 64 clients, two replicas, kill -9, a database restart."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import grpc
from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2_grpc
from labelrm.v1 import resource_manager_pb2 as pb

from tests.helpers import BOTH_PATHS, GiB, limit_req, load, load_instance, register
from tests.load import ECMS, run_load

STRESS_SECONDS = float(os.environ.get("LABELRM_STRESS_SECONDS", "10"))
NORMAL = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}


async def seed(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        for i, ecm in enumerate(ECMS):
            await rm.RegisterEcm(
                register(
                    ecm,
                    load_instance(2 * GiB, 2000, 100),
                    load_instance(256 * 1024**2 * (i % 2), 0, 0),
                )
            )
        await admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(GiB, 1500)))
        await admin.SetLabelLimit(
            limit_req("userCreator=u0-*,engineType=spark-3.2.1", load(512 * 1024**2, 800))
        )


async def check(target: str) -> admin_pb2.CheckConsistencyResponse:
    async with grpc.aio.insecure_channel(target) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        return await admin.CheckConsistency(admin_pb2.CheckConsistencyRequest(), timeout=30)


async def live_records(target: str) -> list[pb.LabelResource]:
    async with grpc.aio.insecure_channel(target) as channel:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        resp = await rm.ListLabelResources(pb.ListLabelResourcesRequest(page_size=1000))
        return list(resp.label_resources)


def assert_all_returned(records: list[pb.LabelResource]) -> None:
    for record in records:
        assert record.live_tickets == 0, record
        kind = record.locked_resource.WhichOneof("kind")
        locked = getattr(record.locked_resource, kind)
        used = getattr(record.used_resource, kind)
        assert locked.memory_bytes == 0 and used.memory_bytes == 0, record


async def periodic_checks(target: str, stop_at: float, results: list[Any]) -> None:
    while time.monotonic() < stop_at:
        results.append(await check(target))
        await asyncio.sleep(1.0)


@BOTH_PATHS
async def test_64_concurrent_clients_keep_every_invariant(rm_process_factory):
    server = rm_process_factory()
    server.start()
    await seed(server.target)
    checks: list[Any] = []
    stats = await run_load(
        [server.target],
        STRESS_SECONDS,
        64,
        NORMAL,
        during=periodic_checks(server.target, time.monotonic() + STRESS_SECONDS, checks),
    )
    assert stats.unexpected == []
    assert stats.ok["apply"] > 100 and stats.ok["release"] > 100 and stats.ok["report"] > 50
    assert stats.codes["RESOURCE_EXHAUSTED"] > 0  # the load really hit the limits
    assert checks and all(c.consistent for c in checks), [c for c in checks if not c.consistent]
    report = await check(server.target)
    assert report.consistent, report.mismatches
    assert_all_returned(await live_records(server.target))


@BOTH_PATHS
async def test_two_replicas_on_one_database(rm_process_factory):
    first, second = rm_process_factory(), rm_process_factory()
    first.start()
    second.start()
    await seed(first.target)
    stats = await run_load([first.target, second.target], STRESS_SECONDS / 2, 32, NORMAL)
    assert stats.unexpected == []
    assert stats.ok["apply"] > 50
    report = await check(second.target)
    assert report.consistent, report.mismatches
    assert_all_returned(await live_records(first.target))


@BOTH_PATHS
async def test_kill_9_mid_load_then_restart(rm_process_factory):
    server = rm_process_factory("--lock-timeout", "3", "--sweep-interval", "0.5")
    server.start()
    await seed(server.target)

    async def crash_and_restart() -> None:
        await asyncio.sleep(STRESS_SECONDS / 4)
        server.kill()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)

    allowed = NORMAL | {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION}
    stats = await run_load(
        [server.target],
        STRESS_SECONDS / 2,
        32,
        allowed,
        release_at_end=False,
        during=crash_and_restart(),
    )
    assert stats.unexpected == []
    assert stats.retried["UNAVAILABLE"] > 0  # the clients did see the crash
    report = await check(server.target)
    assert report.consistent, report.mismatches

    # Tickets left LOCKED by the workers expire and give their resource back.
    async def no_locked() -> bool:
        async with grpc.aio.insecure_channel(server.target) as channel:
            rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
            resp = await rm.ListTickets(pb.ListTicketsRequest(state=pb.TICKET_STATE_LOCKED))
            return not resp.tickets

    from tests.helpers import wait_until

    await wait_until(no_locked, timeout=30, interval=0.2)
    async with grpc.aio.insecure_channel(server.target) as channel:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        for tid in stats.held:
            await rm.Release(pb.ReleaseRequest(ticket_id=tid))
    report = await check(server.target)
    assert report.consistent, report.mismatches
    assert_all_returned(await live_records(server.target))


@BOTH_PATHS
async def test_database_restart_under_load(rm_process_factory, own_postgres):
    server = rm_process_factory(url=own_postgres.url)
    server.start()
    await seed(server.target)
    started_before = own_postgres.postmaster_start()

    async def restart_database() -> None:
        await asyncio.sleep(STRESS_SECONDS / 4)
        await asyncio.to_thread(own_postgres.stop)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(own_postgres.start)

    allowed = NORMAL | {grpc.StatusCode.UNAVAILABLE}
    stats = await run_load(
        [server.target], STRESS_SECONDS / 2, 16, allowed, during=restart_database()
    )
    assert stats.unexpected == []
    assert own_postgres.postmaster_start() != started_before  # it really restarted
    assert stats.ok["apply"] > 20
    report = await check(server.target)
    assert report.consistent, report.mismatches
    assert_all_returned(await live_records(server.target))
