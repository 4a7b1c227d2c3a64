"""Parts of bench/scale.py: the measurements each part of the run takes (an apply load,
the liveness sweep's cost, paging through lists, a server's memory as it works, the
rows retention keeps)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from bench.apply_cycle import seed
from bench.common import BenchDatabase, Server, pct, run_loadgen, stack
from bench.scale_parts import APPLY_CLIENTS, LARGE_USERS, PAGE, count_rows, progress


def apply_run(
    db: BenchDatabase, server: Server, mode: str, users: int, seconds: float
) -> dict[str, Any]:
    db.settle()
    res, cpu = run_loadgen(
        "apply",
        server.target,
        APPLY_CLIENTS,
        seconds,
        extra=["--mode", mode, "--users", str(users)],
        meter_groups=lambda: {"server": server.pids, "postgres": db.postgres_pids()},
        native=True,
    )
    cycles = [
        a + b + c
        for a, b, c in zip(
            *(res["latency"].get(k, []) for k in ("Apply", "ReportUsed", "Release")), strict=False
        )
    ]
    return {
        "cycles_per_s": round(res["count"] / res["seconds"], 1),
        "cycles": res["count"],
        "Apply_p99_ms": round(pct(res["latency"].get("Apply", []), 0.99), 2),
        "cycle_p99_ms": round(pct(cycles, 0.99), 2),
        "errors": res["errors"],
        "cpu": cpu,
    }


def _pages(conn: Any, query: str, params: dict[str, Any]) -> int:

    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()[0]
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))


def sweep_cost(url: str, repeat: int = 50) -> dict[str, Any]:
    """The ECM liveness sweep's query as the sweep runs it: pages read and time."""
    from datetime import UTC, datetime, timedelta

    import psycopg

    from rm_server.store.ecms import EXPIRED_ECMS_SQL

    silent_since = datetime.now(UTC) - timedelta(seconds=30)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE ecm")
        params = {"silent_since": silent_since}
        pages = _pages(conn, EXPIRED_ECMS_SQL, params)
        # The same question answered by reading every ECM (as before the index).
        conn.execute("SET enable_indexscan = off")
        conn.execute("SET enable_bitmapscan = off")
        scan_pages = _pages(conn, EXPIRED_ECMS_SQL, params)
        conn.execute("RESET enable_indexscan")
        conn.execute("RESET enable_bitmapscan")
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            conn.execute(EXPIRED_ECMS_SQL, {"silent_since": silent_since}).fetchall()
            times.append(time.perf_counter() - t0)
    return {
        "ecms": count_rows(url, "ecm"),
        "pages": pages,
        "scan_pages": scan_pages,
        "p50_ms": round(pct(times, 0.5), 3),
        "p99_ms": round(pct(times, 0.99), 3),
    }


async def page_through(target: str, what: str) -> dict[str, Any]:
    """Every page of 500 of ListLabelResources or ListTickets, each page's latency."""
    import grpc
    from labelrm.v1 import resource_manager_pb2 as pb
    from labelrm.v1 import resource_manager_pb2_grpc

    times: list[float] = []
    items = 0
    async with grpc.aio.insecure_channel(target) as ch:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        token = ""
        while True:
            t0 = time.perf_counter()
            if what == "labels":
                resp = await rm.ListLabelResources(
                    pb.ListLabelResourcesRequest(page_size=PAGE, page_token=token), timeout=60
                )
                items += len(resp.label_resources)
            else:
                resp = await rm.ListTickets(
                    pb.ListTicketsRequest(page_size=PAGE, page_token=token), timeout=60
                )
                items += len(resp.tickets)
            times.append(time.perf_counter() - t0)
            token = resp.next_page_token
            if not token:
                break
    tenth = max(1, len(times) // 10)
    return {
        "pages": len(times),
        "items": items,
        "first_p50_ms": round(pct(times[:tenth], 0.5), 2),
        "last_p50_ms": round(pct(times[-tenth:], 0.5), 2),
        "first_p99_ms": round(pct(times[:tenth], 0.99), 2),
        "last_p99_ms": round(pct(times[-tenth:], 0.99), 2),
        "p99_ms": round(pct(times, 0.99), 2),
    }


def rss_mib(pid: int) -> float:
    import psutil

    return round(float(psutil.Process(pid).memory_info().rss) / 2**20, 1)


# The memory part's samples: RSS after each of these cumulative apply cycles.
MEMORY_CHECKPOINTS = (10_000, 30_000, 100_000, 300_000, 1_000_000)
QUICK_MEMORY_CHECKPOINTS = (1_000, 3_000, 10_000)


def memory_run(
    db: BenchDatabase, server: Server, checkpoints: Sequence[int]
) -> list[dict[str, Any]]:
    """The rm-server's RSS after each of `checkpoints` apply cycles (spread over
    LARGE_USERS user labels, 64 clients). Cycles are counted where they end, in
    ticket_history (a released ticket is one row), not by the load generator: its
    warm-up's cycles count too."""
    assert server.proc is not None
    samples: list[dict[str, Any]] = []
    done = count_rows(db.url, "ticket_history")
    started, rate = done, 0.0
    for checkpoint in checkpoints:
        while done < started + checkpoint:
            left = started + checkpoint - done
            # short windows near a checkpoint (overshoot it by little), at most a minute
            seconds = 2.0 if rate <= 0 else min(60.0, max(1.0, 0.9 * left / rate))
            t0 = time.monotonic()
            run_loadgen(
                "apply",
                server.target,
                APPLY_CLIENTS,
                seconds,
                warmup=0.0,
                extra=["--users", str(LARGE_USERS)],
                native=True,
            )
            before, done = done, count_rows(db.url, "ticket_history")
            rate = (done - before) / max(0.1, time.monotonic() - t0)
        sample = {"cycles": done - started, "rss_mib": rss_mib(server.proc.pid)}
        samples.append(sample)
        progress("memory", sample)
    return samples


def retention_run(database_url: str, retention_s: float, periods: int) -> dict[str, Any]:
    """Hot load for `periods` retention periods on a server whose retention is
    `retention_s` seconds; rows of the pruned tables counted every period."""
    days = retention_s / 86400
    args = [
        "--ecm-expiry", "86400",
        "--history-retention-days", repr(days),
        "--request-id-retention-hours", repr(retention_s / 3600),
    ]  # fmt: skip
    samples: list[dict[str, int]] = []
    with stack(database_url, args) as (db, server):
        asyncio.run(seed(server.target))
        for _ in range(periods):
            run_loadgen(
                "apply",
                server.target,
                APPLY_CLIENTS,
                retention_s,
                warmup=0.5,
                extra=["--mode", "hot"],
                native=True,
            )
            samples.append({t: count_rows(db.url, t) for t in ("ticket_history", "request_log")})
    return {"retention_s": retention_s, "samples": samples}
