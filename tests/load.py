"""A random apply / report / release load for the concurrency, crash, replica and
database-restart tests. Workers retry UNAVAILABLE (and their own deadline) with the
SAME request id, as the SDK does, so an ambiguous failure can never charge twice."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import grpc
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc

from tests.support.messages import apply_req, load

MiB = 1024**2
USERS = [f"u{i}-IDE" for i in range(6)]
ENGINES = ["spark-3.2.1", "hive-2.3.3"]
ECMS = [f"host{i}:9000" for i in range(4)]
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


@dataclass
class LoadStats:
    ok: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)  # ticket id -> LOCKED / USED
    retried: Counter[str] = field(default_factory=Counter)  # outages ridden out


async def _call(
    method, request, deadline: float, stats: LoadStats | None = None, timeout: float = 10.0
):
    """Call with retries on UNAVAILABLE / timeouts, same request id, until the deadline."""
    while True:
        try:
            return await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            wait_shortfall = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and (
                "no capacity" in (exc.details() or "")
            )
            if exc.code() not in RETRYABLE or wait_shortfall or time.monotonic() > deadline:
                raise
            if stats is not None:
                stats.retried[exc.code().name] += 1
            await asyncio.sleep(0.1)


async def worker(
    stub: resource_manager_pb2_grpc.ResourceManagerServiceStub,
    seed: int,
    stop_at: float,
    stats: LoadStats,
    allowed: set[grpc.StatusCode],
    give_up_at: float,
) -> None:
    rng = random.Random(seed)
    mine: dict[str, str] = {}
    while time.monotonic() < stop_at:
        roll = rng.random()
        try:
            if not mine or (roll < 0.45 and len(mine) < 3):
                labels = (
                    f"userCreator={rng.choice(USERS)},engineType={rng.choice(ENGINES)},"
                    f"emInstance={rng.choice(ECMS)}"
                )
                wait = rng.choice([0.0, 0.0, 0.0, 0.3])
                req = apply_req(
                    labels,
                    load(rng.randint(1, 4) * 64 * MiB, rng.randint(1, 4) * 100),
                    request_id=f"apply-{uuid.uuid4().hex}",
                    wait=wait,
                )
                resp = await _call(stub.Apply, req, give_up_at, stats)
                mine[resp.ticket.ticket_id] = "LOCKED"
                stats.ok["apply"] += 1
            elif roll < 0.7 and "LOCKED" in mine.values():
                tid = rng.choice([t for t, s in mine.items() if s == "LOCKED"])
                await _call(
                    stub.ReportUsed,
                    pb.ReportUsedRequest(request_id=f"rep-{uuid.uuid4().hex}", ticket_id=tid),
                    give_up_at,
                    stats,
                )
                mine[tid] = "USED"
                stats.ok["report"] += 1
            else:
                tid = rng.choice(list(mine))
                await _call(
                    stub.Release,
                    pb.ReleaseRequest(request_id=f"rel-{uuid.uuid4().hex}", ticket_id=tid),
                    give_up_at,
                    stats,
                )
                del mine[tid]
                stats.ok["release"] += 1
        except grpc.aio.AioRpcError as exc:
            stats.codes[exc.code().name] += 1
            if exc.code() not in allowed:
                stats.unexpected.append(f"{exc.code().name}: {exc.details()}")
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                mine = {t: s for t, s in mine.items() if t not in (exc.details() or "")}
    stats.held.update(mine)


async def run_load(
    targets: list[str],
    seconds: float,
    tasks: int,
    allowed: set[grpc.StatusCode],
    *,
    release_at_end: bool = True,
    during: object = None,
) -> LoadStats:
    """Run `tasks` workers spread over `targets` for `seconds`; optionally release all."""
    stats = LoadStats()
    channels = [grpc.aio.insecure_channel(t) for t in targets]
    stubs = [resource_manager_pb2_grpc.ResourceManagerServiceStub(c) for c in channels]
    stop_at = time.monotonic() + seconds
    give_up_at = stop_at + 60
    try:
        jobs = [
            worker(stubs[i % len(stubs)], i, stop_at, stats, allowed, give_up_at)
            for i in range(tasks)
        ]
        if during is not None:
            jobs.append(during)  # type: ignore[arg-type]
        await asyncio.gather(*jobs)
        if release_at_end:
            for tid in list(stats.held):
                await _call(stubs[0].Release, pb.ReleaseRequest(ticket_id=tid), give_up_at)
                del stats.held[tid]
    finally:
        for channel in channels:
            await channel.close()
    return stats
