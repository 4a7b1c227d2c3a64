"""Parts of bench/scale.py: the large cluster made with SQL (copies of real rows), the
demands workload, and the background-pass metric read from the RM's metrics endpoint."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from bench.apply_cycle import seed
from bench.common import BenchDatabase, CpuMeter, Server, pct, stack

APPLY_CLIENTS = 64
SMALL_USERS = 1_000
LARGE_USERS = 100_000
PAGE = 500


def progress(what: str, value: Any) -> None:
    """A stage's figures on stderr as they come (the table waits for the end)."""
    print(
        f"[{time.strftime('%H:%M:%S')}] {what}: {json.dumps(value, default=str)}",
        file=sys.stderr,
        flush=True,
    )


# ----- seeding with SQL ---------------------------------------------------------------------


def _columns(conn: Any, table_name: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
        " AND table_schema = 'public' ORDER BY ordinal_position",
        (table_name,),
    ).fetchall()
    return [r[0] for r in rows]


def clone_rows(
    url: str, table_name: str, template_where: str, overrides: dict[str, str], count: int
) -> float:
    """Insert `count` copies of one existing row (`template_where` picks it), the
    columns in `overrides` computed from g = 1..count. Returns the seconds it took."""
    import psycopg

    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        cols = _columns(conn, table_name)
        select = ", ".join(overrides.get(c, f"t.{c}") for c in cols)
        step = 1_000_000
        for start in range(1, count + 1, step):
            end = min(count, start + step - 1)
            conn.execute(
                f"INSERT INTO {table_name} ({', '.join(cols)})"  # noqa: S608
                f" SELECT {select} FROM (SELECT * FROM {table_name} WHERE {template_where}"
                f" LIMIT 1) t, generate_series({start}, {end}) g"
            )
        conn.execute(f"VACUUM ANALYZE {table_name}")
    return round(time.monotonic() - t0, 1)


def count_rows(url: str, table_name: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0])  # type: ignore[index]  # noqa: S608


def seed_healthy_ecms(url: str, total: int) -> None:
    """Healthy ECMs (copies of a bench ECM, heartbeats not due) up to `total` ECMs."""
    have = count_rows(url, "ecm")
    clone_rows(
        url,
        "ecm",
        "true",
        {
            "instance": f"'healthy' || (g + {have}) || ':9000'",
            "label": f"'emInstance=healthy' || (g + {have}) || ':9000'",
            "last_heartbeat_at": "now() + interval '1 day'",
            "beat_mark": "now() + interval '1 day'",
        },
        total - have,
    )


def seed_tickets(db: BenchDatabase, server: Server, count: int) -> str:
    """`count` live tickets (copies of one real ticket, ids z-00000001...)."""
    import grpc
    from labelrm.v1 import resource_manager_pb2 as pb
    from labelrm.v1 import resource_manager_pb2_grpc, resource_pb2

    from bench.loadgen import ENGINE, GiB, ecm_name, labels_of, user_label

    with grpc.insecure_channel(server.target) as ch:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        t = rm.Apply(
            pb.ApplyRequest(
                labels=labels_of(
                    f"userCreator={user_label(0)},engineType={ENGINE},emInstance={ecm_name(0)}"
                ),
                resource=resource_pb2.Resource(
                    load=resource_pb2.LoadResource(memory_bytes=GiB, cpu_millis=100)
                ),
            )
        ).ticket
    clone_rows(
        db.url,
        "ticket",
        f"ticket_id = '{t.ticket_id}'",
        {"ticket_id": "'z-' || lpad(g::text, 8, '0')"},
        count,
    )
    return str(t.ticket_id)


def drop_seeded_tickets(db: BenchDatabase, server: Server, template: str) -> None:
    """The copies go (they were never charged to a label), the template is released."""
    import grpc
    import psycopg
    from labelrm.v1 import resource_manager_pb2 as pb
    from labelrm.v1 import resource_manager_pb2_grpc

    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute("DELETE FROM ticket WHERE ticket_id LIKE 'z-%'")
        conn.execute("VACUUM ANALYZE ticket")
    with grpc.insecure_channel(server.target) as ch:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        rm.Release(pb.ReleaseRequest(ticket_id=template))


# ----- demands -------------------------------------------------------------------------------

BLOCKED_USER = "blk-IDE"
ACCEPTED_WHEN = "{Start: {Time: [+2h, +10m], Strategy: loose}, Duration: +30m}"
BLOCKED_WHEN = "{Start: {Time: [NOW, +2h], Strategy: loose}, Duration: +1h}"


async def submit_demands(target: str, kind: str, first: int, count: int) -> list[float]:
    """Submit `count` demands (ids from `first`), 16 in flight; their latencies (s).
    Accepted ones start in two hours on 1,000 user labels; blocked ones are due now on
    the label an ordinary ticket fills (block_label), so every round passes them over."""
    import grpc
    from labelrm.v1 import demand_pb2, demand_pb2_grpc, resource_pb2

    from bench.loadgen import ENGINE, GiB, labels_of, user_label

    resource = resource_pb2.Resource(
        load=resource_pb2.LoadResource(memory_bytes=GiB, cpu_millis=100)
    )
    times: list[float] = []
    todo = list(range(first, first + count))
    async with grpc.aio.insecure_channel(target) as ch:
        stub = demand_pb2_grpc.DemandServiceStub(ch)

        async def worker() -> None:
            while todo:
                i = todo.pop(0)
                user = BLOCKED_USER if kind == "blocked" else user_label(i % SMALL_USERS)
                request = demand_pb2.SubmitDemandRequest(
                    demand_id=f"{kind}-{i}",
                    user=user.removesuffix("-IDE"),
                    labels=labels_of(f"userCreator={user},engineType={ENGINE}"),
                    resource=resource,
                    time_conditions_text=BLOCKED_WHEN if kind == "blocked" else ACCEPTED_WHEN,
                )
                t0 = time.perf_counter()
                await stub.SubmitDemand(request, timeout=60)
                times.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(16)))
    return times


async def block_label(target: str, blocked: int) -> None:
    """A limit on the blocked demands' label with room for all of them in the plan, and
    an ordinary ticket that takes all of it (ReportUsed: it never expires)."""
    import grpc
    from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2_grpc, resource_pb2
    from labelrm.v1 import resource_manager_pb2 as pb

    from bench.loadgen import ENGINE, GiB, labels_of

    labels = labels_of(f"userCreator={BLOCKED_USER},engineType={ENGINE}")
    room = resource_pb2.LoadResource(memory_bytes=blocked * GiB, cpu_millis=blocked * 100)
    async with grpc.aio.insecure_channel(target) as ch:
        await admin_pb2_grpc.AdminServiceStub(ch).SetLabelLimit(
            admin_pb2.SetLabelLimitRequest(
                labels=labels, max_resource=resource_pb2.Resource(load=room)
            )
        )
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        t = (
            await rm.Apply(
                pb.ApplyRequest(labels=labels, resource=resource_pb2.Resource(load=room))
            )
        ).ticket
        await rm.ReportUsed(pb.ReportUsedRequest(ticket_id=t.ticket_id))


def blocked_rounds(url: str) -> tuple[int, int]:
    """The rounds counted on the blocked demands (passed over), and how many there are."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(rounds), 0), count(*) FROM demand WHERE user_name = %s",
            (BLOCKED_USER.removesuffix("-IDE"),),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def scrape_passes(metrics_port: int, job: str) -> dict[float, float]:
    """Cumulative bucket counts of labelrm_background_pass_seconds{job} (upper bound ->)."""
    import urllib.request

    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        .read()
        .decode()
    )
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("labelrm_background_pass_seconds_bucket{") and f'job="{job}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def passes_between(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """Passes in a window from two scrapes: how many, and the bucket bound of their p50/p99."""
    counts = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(float("inf"), 0.0)

    def quantile(q: float) -> float | None:
        for le, n in counts.items():
            if total and n >= q * total:
                return le * 1000
        return None

    return {"passes": int(total), "p50_le_ms": quantile(0.5), "p99_le_ms": quantile(0.99)}


def demand_run(database_url: str, accepted: int, blocked: int, window: float) -> dict[str, Any]:
    """SubmitDemand latency and planner passes with few demands, then with `accepted`
    accepted and `blocked` blocked ones (a tenth of each first, as the small case)."""
    from bench.common import free_port

    port = free_port()
    out: dict[str, Any] = {"accepted": accepted, "blocked": blocked}
    with stack(
        database_url, ["--ecm-expiry", "86400", "--metrics-listen", f"127.0.0.1:{port}"]
    ) as (db, server):
        asyncio.run(seed(server.target))
        asyncio.run(block_label(server.target, blocked))
        for phase, n_acc, n_blk, acc0, blk0 in (
            ("small", accepted // 10, blocked // 10, 0, 0),
            (
                "large",
                accepted - accepted // 10,
                blocked - blocked // 10,
                accepted // 10,
                blocked // 10,
            ),
        ):
            # CPU in cores while submitting and during the window; `other` is the rest of
            # the machine (other users' work: a large `other` means disturbed figures).
            groups = {"server": server.pids, "postgres": db.postgres_pids()}
            meter = CpuMeter({**groups, "bench": [os.getpid()]})
            meter.start()
            times = asyncio.run(submit_demands(server.target, "accepted", acc0, n_acc))
            times += asyncio.run(submit_demands(server.target, "blocked", blk0, n_blk))
            submit_cpu = meter.stop()
            # Steady state: every new demand has had its first round (two passes that
            # began after the last submission have ended).
            started = scrape_passes(port, "demand-planner").get(float("inf"), 0.0)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                time.sleep(1.0)
                if scrape_passes(port, "demand-planner").get(float("inf"), 0.0) >= started + 3:
                    break
            before = scrape_passes(port, "demand-planner")
            rounds0 = blocked_rounds(db.url)
            meter = CpuMeter(groups)
            meter.start()
            t0 = time.monotonic()
            time.sleep(window)
            window_cpu = meter.stop()
            rounds1 = blocked_rounds(db.url)
            # Rounds each blocked demand was given per second: 1 / demand_interval when
            # every pass gives each one its round, half that when every second pass does.
            rate = (rounds1[0] - rounds0[0]) / max(rounds1[1], 1) / (time.monotonic() - t0)
            passes = passes_between(before, scrape_passes(port, "demand-planner"))
            tail = times[-min(len(times), 500) :]
            out[phase] = {
                "demands": count_rows(db.url, "demand"),
                "submit_p50_ms": round(pct(tail, 0.5), 2),
                "submit_p99_ms": round(pct(tail, 0.99), 2),
                "planner": passes,
                "blocked_rounds_per_s": round(rate, 2),
                "cpu_submitting": submit_cpu,
                "cpu_window": window_cpu,
            }
            progress(f"demands, {phase}", out[phase])
    return out
