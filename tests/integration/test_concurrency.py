"""Concurrency and failure: 64 clients, two replicas, kill -9, a database restart."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from typing import Any

import grpc
from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2_grpc
from labelrm.v1 import resource_manager_pb2 as pb

from tests.load import ECMS, run_load
from tests.support.database import deadlocks_counted, deadlocks_so_far
from tests.support.env import BOTH_PATHS
from tests.support.messages import GiB, lbl, limit_req, load, load_instance, register

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


# The planner's rounds in the storm: short rounds and lead time, claims expire fast.
DEMAND_ARGS: tuple[str, ...] = ("--demand-interval", "0.2", "--demand-lead-time", "0.5")
DEMAND_ARGS += ("--demand-claim-timeout", "3")


@BOTH_PATHS
async def test_two_replicas_on_one_database(rm_process_factory, database_url):
    """Apply / ReportUsed / Release (some waiting in line), demands submitted, allocated,
    claimed, released and cancelled on the same labels, across two replicas: every
    invariant holds, and PostgreSQL counted no deadlock (every transaction takes its
    row locks in one canonical order, docs/architecture.md)."""
    first, second = rm_process_factory(*DEMAND_ARGS), rm_process_factory(*DEMAND_ARGS)
    first.start()
    second.start()
    await seed(first.target)
    before = deadlocks_so_far(database_url)
    targets = [first.target, second.target]
    demands = Counter[str]()
    stop_at = time.monotonic() + STRESS_SECONDS / 2
    stats = await run_load(
        targets,
        STRESS_SECONDS / 2,
        32,
        NORMAL,
        during=asyncio.gather(*(demand_worker(targets, n, stop_at, demands) for n in range(6))),
    )
    assert stats.unexpected == []
    assert stats.ok["apply"] > 50
    assert demands["submitted"] > 0 and demands["unexpected"] == 0, demands
    report = await check(second.target)
    assert report.consistent, report.mismatches
    assert_all_returned(await live_records(first.target))
    first.terminate()
    second.terminate()
    assert deadlocks_counted(database_url) == before


async def demand_worker(targets: list[str], n: int, stop_at: float, seen: Counter[str]) -> None:
    """Demands on the load's labels until `stop_at`: each claimed and released once
    allocated, cancelled when it is not within a second (or when its turn never comes)."""
    from labelrm.v1 import demand_pb2 as dpb
    from labelrm.v1 import demand_pb2_grpc

    from tests.load import ENGINES, USERS

    async with grpc.aio.insecure_channel(targets[n % len(targets)]) as channel:
        stub = demand_pb2_grpc.DemandServiceStub(channel)
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        i = 0
        while time.monotonic() < stop_at:
            i += 1
            demand_id, user = f"storm-{n}-{i}", USERS[n % len(USERS)].removesuffix("-IDE")
            labels = f"userCreator={user}-IDE,engineType={ENGINES[i % 2]},emInstance={ECMS[n % 4]}"
            try:
                await stub.SubmitDemand(
                    dpb.SubmitDemandRequest(
                        demand_id=demand_id,
                        user=user,
                        labels=lbl(labels),
                        resource=load(64 * 1024**2, 100),
                        time_conditions_text="{Start: [NOW, +30s], Duration: +5s}",
                    ),
                    timeout=10,
                )
            except grpc.aio.AioRpcError as exc:
                seen["refused" if exc.code() in NORMAL else "unexpected"] += 1
                continue
            seen["submitted"] += 1
            await _claim_or_cancel(stub, rm, dpb, demand_id, user, time.monotonic() + 1, seen)


async def _claim_or_cancel(
    stub: Any, rm: Any, dpb: Any, demand_id: str, user: str, give_up: float, seen: Counter[str]
) -> None:
    get = dpb.GetDemandRequest(demand_id=demand_id, user=user)
    while time.monotonic() < give_up:
        demand = (await stub.GetDemand(get, timeout=10)).demand
        if demand.state == dpb.DEMAND_STATE_ALLOCATED:
            try:
                claimed = await stub.ClaimDemand(
                    dpb.ClaimDemandRequest(demand_id=demand_id, user=user), timeout=10
                )
            except grpc.aio.AioRpcError as exc:  # the claim timeout passed meanwhile
                late = exc.code() == grpc.StatusCode.FAILED_PRECONDITION
                seen["late" if late else "unexpected"] += 1
                return
            await rm.Release(pb.ReleaseRequest(ticket_id=claimed.ticket.ticket_id), timeout=10)
            seen["claimed"] += 1
            return
        if demand.state in (dpb.DEMAND_STATE_FAILED, dpb.DEMAND_STATE_FINISHED):
            return
        await asyncio.sleep(0.05)
    await stub.CancelDemand(dpb.CancelDemandRequest(demand_id=demand_id, user=user), timeout=10)
    seen["cancelled"] += 1


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

    from tests.support.waiting import wait_until

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
