"""The web console's cost on the RM: the RM's work per poll with 1 and 5 browsers open.

    python -m bench.console [--tickets 1000] [--browsers 1 5] [--seconds 30]
                            [--tree PATH] [--database-url URL]

Starts a private embedded PostgreSQL (or a throwaway database on --database-url) and an
rm-server in dev mode serving the console, applies --tickets live tickets, then for each
number of browsers polls as the console's pages do: every browser has the overview and
the tickets list open, each page re-reading its endpoint two seconds after its last
answer (the page's POLL_MS). The "browsers" are HTTP clients making the pages' requests
(the work measured is the RM's, not the browser's). Per configuration, over the window:
the polls answered, the bytes per poll, the views the console computed (its
labelrm_console_view_builds_total), the RM's CPU (psutil on its pid) and the database's
transactions (pg_stat_database), each net of the same window with no browser open (the
RM's background passes, slowed to one every 30 s so that they do not drown the
console's figures), per poll period of two seconds. The ratio of 5
browsers to 1 is the figure that matters: 1.0 means the RM's work does not grow with
the browsers open. --tree runs another checkout's rm-server (the same requests against
an earlier version: what the figures were before). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

from bench.common import BenchDatabase, Server, emit, table
from bench.serving import free_port

POLL = 2.0  # the console's POLL_MS
PAGES = ("/api/overview", "/api/tickets")  # what each browser has open
MiB = 1024**2


async def seed(target: str, tickets: int) -> None:
    import grpc
    from labelrm.v1 import resource_manager_pb2 as pb
    from labelrm.v1 import resource_manager_pb2_grpc
    from labelrm.v1 import resource_pb2 as rpb

    labels = [
        rpb.Label(key="userCreator", value="alice-IDE"),
        rpb.Label(key="engineType", value="shell-1"),
    ]
    res = rpb.Resource(load=rpb.LoadResource(memory_bytes=MiB, cpu_millis=1))
    async with grpc.aio.insecure_channel(target) as ch:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        for start in range(0, tickets, 200):
            calls = [
                rm.Apply(pb.ApplyRequest(labels=labels, resource=res, user="alice"), timeout=60)
                for _ in range(min(200, tickets - start))
            ]
            await asyncio.gather(*calls)


def builds(metrics: str) -> int:
    """The console's view computations so far (0 for an rm-server without the metric)."""
    import urllib.request

    with urllib.request.urlopen(metrics + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("labelrm_console_view_builds_total{")
    )


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` so far (not rounded: a poll costs milliseconds)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def transactions(db: BenchDatabase) -> int:
    import psycopg

    with psycopg.connect(db.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


async def poll(url: str, stop: float, counts: dict[str, int], window: list[float]) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        while time.monotonic() < stop:
            async with session.get(url) as r:
                body = await r.read()
            now = time.monotonic()
            if window[0] <= now <= window[1]:
                counts["polls"] += 1
                counts["bytes"] += len(body)
            await asyncio.sleep(POLL)


def measure(
    server: Server, db: BenchDatabase, urls: tuple[str, str], browsers: int, seconds: float
) -> dict[str, Any]:
    """One window of `browsers` browsers, each with every page of PAGES open."""
    console, metrics = urls
    warmup = 4.0
    counts = {"polls": 0, "bytes": 0}
    rm_pids, pg_pids = server.pids, db.postgres_pids()

    async def run() -> None:
        begin = time.monotonic()
        window = [begin + warmup, begin + warmup + seconds]
        tasks = [
            asyncio.ensure_future(poll(console + page, window[1], counts, window))
            for _ in range(browsers)
            for page in PAGES
        ]
        await asyncio.sleep(warmup)
        before.append(transactions(db))
        built.append(await asyncio.to_thread(builds, metrics))
        start = (cpu_seconds(rm_pids), cpu_seconds(pg_pids))
        await asyncio.sleep(seconds)
        used.update(rm=cpu_seconds(rm_pids) - start[0], postgres=cpu_seconds(pg_pids) - start[1])
        built.append(await asyncio.to_thread(builds, metrics))
        await asyncio.gather(*tasks)

    before: list[int] = []
    built: list[int] = []
    used: dict[str, float] = {}
    asyncio.run(run())
    time.sleep(11.0)  # idle backends report their statistics within 10 s
    xacts = transactions(db) - before[0]
    periods = seconds / POLL
    return {
        "browsers": browsers,
        "polls": counts["polls"],
        "kib_per_poll": round(counts["bytes"] / max(1, counts["polls"]) / 1024, 1),
        "builds_per_period": round((built[1] - built[0]) / periods, 2),
        "rm_cpu_ms_per_period": round(used["rm"] / periods * 1000, 1),
        "pg_cpu_ms_per_period": round(used["postgres"] / periods * 1000, 1),
        "xacts_per_period": round(xacts / periods, 1),
        "loadavg_1m": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tickets", type=int, default=1000)
    ap.add_argument("--browsers", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--tree", default="", help="run the rm-server of this checkout")
    ap.add_argument("--database-url", default="")
    args = ap.parse_args()

    db = BenchDatabase(args.database_url).start()
    port, metrics_port = free_port(), free_port()
    quiet = ("--sweep-interval", "30", "--demand-interval", "30")
    server = Server(
        db.url,
        extra=("--console-listen", f"127.0.0.1:{port}",
               "--metrics-listen", f"127.0.0.1:{metrics_port}", *quiet),
    )  # fmt: skip
    if args.tree:
        server.cwd = Path(args.tree).resolve()
    server.start()
    urls = (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}")
    try:
        asyncio.run(seed(server.target, args.tickets))
        idle = measure(server, db, urls, 0, args.seconds)
        rows = [measure(server, db, urls, n, args.seconds) for n in args.browsers]
    finally:
        server.stop()
        db.stop()
    for r in rows:  # net of the RM's own background work
        r["rm_cpu_ms_per_period_net"] = round(
            r["rm_cpu_ms_per_period"] - idle["rm_cpu_ms_per_period"], 1
        )
        r["xacts_per_period_net"] = round(r["xacts_per_period"] - idle["xacts_per_period"], 1)
    first, last = rows[0], rows[-1]
    ratio = {
        key: round(last[key] / first[key], 2) if first[key] > 0 else None
        for key in ("rm_cpu_ms_per_period_net", "xacts_per_period_net")
    }
    text = table(
        ["browsers", "polls", "KiB/poll", "views computed/2 s", "RM CPU ms/2 s", "net",
         "DB xacts/2 s", "net", "PG CPU ms/2 s"],
        [
            [r["browsers"], r["polls"], r["kib_per_poll"], r["builds_per_period"],
             r["rm_cpu_ms_per_period"],
             r.get("rm_cpu_ms_per_period_net", "-"), r["xacts_per_period"],
             r.get("xacts_per_period_net", "-"), r["pg_cpu_ms_per_period"]]
            for r in [idle, *rows]
        ],
    )  # fmt: skip
    text += (
        f"\n{args.tickets} live tickets; each browser polls {', '.join(PAGES)} every {POLL:g} s;"
        f" {last['browsers']} browsers / {first['browsers']}: RM CPU x{ratio['rm_cpu_ms_per_period_net']},"
        f" DB transactions x{ratio['xacts_per_period_net']}"
    )
    emit("console", text, {"tickets": args.tickets, "tree": args.tree or "this", "idle": idle,
                           "rows": rows, "ratio": ratio})  # fmt: skip


if __name__ == "__main__":
    main()
