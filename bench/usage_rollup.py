"""The usage ledger's roll-up: what adding ended tickets to the ledger costs the RM and
the database, per ticket, against the grouped write path that ended them.

    python -m bench.usage_rollup [--tickets 20000] [--group 64] [--database-url URL]

Writes `--tickets` history rows as the grouped write path does (groups of `--group`
rows per transaction, each ticket with a userCreator+engineType and an emInstance
label, locked then used, across an hour boundary for one in eight), timing that
(the ceiling: what the write path spends on history alone), then rolls them up with
the RM's own pass (`store.usage.roll_up`, batches of 1000) and prints the RM's CPU
and the wall time per ticket of each, and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import BenchDatabase, emit

GiB = 1024**3
BATCH = 1000  # rows per source per transaction, as the RM (CoreSettings.usage_batch)


def _history(i: int, start: datetime) -> dict[str, Any]:
    user = f"user{i % 100}"
    created = start + timedelta(milliseconds=i * 7)
    ended = created + timedelta(seconds=30 if i % 8 else 3600)
    return {
        "ticket_id": f"t-{i}",
        "final_state": "RELEASED",
        "reason": "released",
        "user_name": user,
        "labels": [
            ["userCreator", f"{user}-IDE"],
            ["engineType", "spark-3.2.1"],
            ["emInstance", f"h{i % 16}:9101"],
        ],
        "charged_labels": [
            f"emInstance=h{i % 16}:9101",
            f"userCreator={user}-IDE,engineType=spark-3.2.1",
        ],
        "requested": {"kind": "load", "memory_bytes": GiB, "cpu_millis": 100},
        "used": {"kind": "load", "memory_bytes": GiB // 2, "cpu_millis": 50},
        "created_at": created.isoformat(),
        "reported_at": (created + timedelta(seconds=1)).isoformat(),
        "ended_at": ended.isoformat(),
    }


async def run(url: str, tickets: int, group: int) -> dict[str, Any]:
    from rm_server.store import usage as usage_store
    from rm_server.store.db import Conn, Database
    from rm_server.store.tickets import INSERT_HISTORY

    db = Database(url, min_size=1, max_size=2)
    await db.migrate()
    await db.open()
    try:
        start = datetime(2026, 1, 1, 0, 40, tzinfo=UTC)
        rows = [_history(i, start) for i in range(tickets)]
        cpu0, wall0 = time.process_time(), time.perf_counter()

        async def insert(conn: Conn, part: str) -> None:
            await conn.execute(INSERT_HISTORY, {"history": part})

        for at in range(0, tickets, group):
            await db.run(insert, json.dumps(rows[at : at + group]))
        write = (time.process_time() - cpu0, time.perf_counter() - wall0)
        prof = cProfile.Profile() if os.environ.get("USAGE_PROFILE") else None
        if prof:
            prof.enable()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        done = 0
        while True:
            rolled = await db.run(usage_store.roll_up, datetime.now(UTC), BATCH)
            done += rolled.rows["tickets"]
            if not rolled.behind and rolled.rows["tickets"] == 0:
                break
        roll = (time.process_time() - cpu0, time.perf_counter() - wall0)
        if prof:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        assert done == tickets, (done, tickets)
    finally:
        await db.close()
    per = 1e6 / tickets
    return {
        "tickets": tickets,
        "group": group,
        "history_write_us_per_ticket": {"rm_cpu": write[0] * per, "wall": write[1] * per},
        "roll_up_us_per_ticket": {"rm_cpu": roll[0] * per, "wall": roll[1] * per},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--tickets", type=int, default=20000)
    parser.add_argument("--group", type=int, default=64)
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    database = BenchDatabase(given_url=args.database_url).start()
    try:
        result = asyncio.run(run(database.url, args.tickets, args.group))
    finally:
        database.stop()
    w, r = result["history_write_us_per_ticket"], result["roll_up_us_per_ticket"]
    text = "\n".join(
        [
            f"usage roll-up: {database.describe}, {args.tickets} ended tickets",
            f"history write (groups of {args.group}): {w['rm_cpu']:.1f} us RM CPU,"
            f" {w['wall']:.1f} us wall per ticket",
            f"roll-up (batches of 1000): {r['rm_cpu']:.1f} us RM CPU,"
            f" {r['wall']:.1f} us wall per ticket",
        ]
    )
    emit("usage_rollup", text, {"database": database.describe, **result})


if __name__ == "__main__":
    main()
