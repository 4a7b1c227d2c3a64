"""Parts of bench/scale.py: the large cluster made with SQL (copies of real rows), the
demands workload, and the background-pass metric read from the RM's metrics endpoint."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any, NamedTuple

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


def grow_user_labels(db: BenchDatabase) -> float:
    """Grow the seeded cluster's 1,000 user label records (bench.apply_cycle.seed) to
    LARGE_USERS, copies of u0's with SQL; the seconds it took."""
    return clone_rows(
        db.url,
        "label_resource",
        "label LIKE '%%userCreator=u0-IDE%%'",
        {"label": "replace(t.label, 'u0-IDE', 'u' || (g + 999) || '-IDE')"},
        LARGE_USERS - SMALL_USERS,
    )


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


def _demand_request(kind: str, i: int) -> Any:
    """Demand `i` of `kind`: accepted ones start in two hours on 1,000 user labels; blocked
    ones are due now on the label an ordinary ticket fills (block_label), so every round
    passes them over."""
    from labelrm.v1 import demand_pb2, resource_pb2

    from bench.loadgen import ENGINE, GiB, labels_of, user_label

    user = BLOCKED_USER if kind == "blocked" else user_label(i % SMALL_USERS)
    return demand_pb2.SubmitDemandRequest(
        demand_id=f"{kind}-{i}",
        user=user.removesuffix("-IDE"),
        labels=labels_of(f"userCreator={user},engineType={ENGINE}"),
        resource=resource_pb2.Resource(
            load=resource_pb2.LoadResource(memory_bytes=GiB, cpu_millis=100)
        ),
        time_conditions_text=BLOCKED_WHEN if kind == "blocked" else ACCEPTED_WHEN,
    )


async def submit_demands(
    target: str, kind: str, first: int, count: int, in_flight: int = 16
) -> list[float]:
    """Submit `count` demands of `kind` (ids from `first`), `in_flight` at a time; their
    latencies (s)."""
    import grpc
    from labelrm.v1 import demand_pb2_grpc

    times: list[float] = []
    todo = list(range(first, first + count))
    async with grpc.aio.insecure_channel(target) as ch:
        stub = demand_pb2_grpc.DemandServiceStub(ch)

        async def worker() -> None:
            while todo:
                request = _demand_request(kind, todo.pop(0))
                t0 = time.perf_counter()
                await stub.SubmitDemand(request, timeout=60)
                times.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(in_flight)))
    return times


async def probe_submissions(target: str, first: int, seconds: float) -> dict[str, list[float]]:
    """One SubmitDemand at a time for `seconds`, accepted and blocked in turn (ids from
    `first`): the latency a submission sees on a cluster that holds the demands already
    there, not the queue of a burst."""
    import grpc
    from labelrm.v1 import demand_pb2_grpc

    times: dict[str, list[float]] = {"accepted": [], "blocked": []}
    end = time.monotonic() + seconds
    i = first
    async with grpc.aio.insecure_channel(target) as ch:
        stub = demand_pb2_grpc.DemandServiceStub(ch)
        while time.monotonic() < end:
            for kind, probes in times.items():
                request = _demand_request(kind, i)
                t0 = time.perf_counter()
                await stub.SubmitDemand(request, timeout=60)
                probes.append(time.perf_counter() - t0)
            i += 1
            await asyncio.sleep(0.2)  # a steady trickle, not a storm
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


def unplanned(url: str) -> int:
    """The demands due that have not had their first round yet."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM demand WHERE rounds = 0 AND state = 'ACCEPTED'"
            " AND next_check_at <= now()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def blocked_rounds(target: str) -> tuple[int, int]:
    """The rounds the blocked demands were passed over (as GetDemand and ListDemands say:
    parked ones count on with the time), and how many there are."""
    import grpc
    from labelrm.v1 import demand_pb2, demand_pb2_grpc

    total = count = 0
    token = ""
    async with grpc.aio.insecure_channel(target) as ch:
        stub = demand_pb2_grpc.DemandServiceStub(ch)
        while True:
            page = await stub.ListDemands(
                demand_pb2.ListDemandsRequest(
                    user=BLOCKED_USER.removesuffix("-IDE"), page_size=1000, page_token=token
                ),
                timeout=60,
            )
            total += sum(d.passed_over_rounds for d in page.demands)
            count += len(page.demands)
            token = page.next_page_token
            if not token:
                return total, count


class PassCounts(NamedTuple):
    """A scrape of labelrm_background_pass_seconds{job}: cumulative bucket counts (upper
    bound ->) and the seconds of all passes together (the histogram's sum)."""

    buckets: dict[float, float]
    seconds: float

    @property
    def total(self) -> float:
        return self.buckets.get(float("inf"), 0.0)


def scrape_passes(metrics_port: int, job: str) -> PassCounts:
    """The passes of background job `job` so far (labelrm_background_pass_seconds{job})."""
    import urllib.request

    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        .read()
        .decode()
    )
    buckets: dict[float, float] = {}
    seconds = 0.0
    for line in text.splitlines():
        if f'job="{job}"' not in line:
            continue
        if line.startswith("labelrm_background_pass_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("labelrm_background_pass_seconds_sum{"):
            seconds = float(line.rsplit(" ", 1)[1])
    return PassCounts(buckets, seconds)


def passes_between(before: PassCounts, after: PassCounts) -> dict[str, Any]:
    """Passes in a window from two scrapes: how many, their mean (exact: the histogram's
    sum), and the bucket bound of their p50/p99."""
    counts = {
        le: after.buckets.get(le, 0.0) - before.buckets.get(le, 0.0) for le in sorted(after.buckets)
    }
    total = counts.get(float("inf"), 0.0)

    def quantile(q: float) -> float | None:
        for le, n in counts.items():
            if total and n >= q * total:
                return le * 1000
        return None

    return {
        "passes": int(total),
        "mean_ms": round((after.seconds - before.seconds) / total * 1000, 3) if total else None,
        "p50_le_ms": quantile(0.5),
        "p99_le_ms": quantile(0.99),
    }


def idle_passes(metrics_port: int, window: float = 6.0) -> dict[str, Any]:
    """The liveness passes of `window` seconds of a server doing nothing else."""
    time.sleep(1.0)  # the pass running when the seeding ended is not counted
    before = scrape_passes(metrics_port, "liveness")
    time.sleep(window)
    return passes_between(before, scrape_passes(metrics_port, "liveness"))


def sweep_apart(
    db: BenchDatabase, metrics_port: int, prefix: str, window: float = 8.0
) -> dict[str, Any]:
    """The liveness passes of a window with nothing else running on the server: its
    fleet just stopped beating and is still healthy (within the ECM expiry, 30 s), no
    registration is under way. How many healthy ECMs, and the passes' mean (exact) and
    bucket bounds."""
    before = scrape_passes(metrics_port, "liveness")
    time.sleep(window)
    passes = passes_between(before, scrape_passes(metrics_port, "liveness"))
    import psycopg

    with psycopg.connect(db.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state <> 'LOST'),"
            " count(*) FILTER (WHERE state <> 'LOST' AND instance LIKE %s) FROM ecm",
            (prefix + "%",),
        ).fetchone()
    assert row is not None
    return {"healthy": int(row[0]), "healthy_of_fleet": int(row[1]), **passes}


def demand_run(database_url: str, accepted: int, blocked: int, window: float) -> dict[str, Any]:
    """SubmitDemand latency and planner passes with few demands, then with `accepted`
    accepted and `blocked` blocked ones (a tenth of each first, as the small case): the
    submissions' burst (16 in flight), then, once every blocked demand has had its first
    round, a window of the planner alone (its passes timed), then one of submissions one
    at a time (accepted and blocked in turn)."""
    from bench.serving import free_port

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
            t0 = time.monotonic()
            times = asyncio.run(submit_demands(server.target, "accepted", acc0, n_acc))
            times += asyncio.run(submit_demands(server.target, "blocked", blk0, n_blk))
            submit_s = time.monotonic() - t0
            submit_cpu = meter.stop()
            # Steady state: every demand due has had its first round (a blocked one:
            # reserved, tried, refused), then two more passes began and ended.
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline and unplanned(db.url) > 0:
                time.sleep(1.0)
            started = scrape_passes(port, "demand-planner").total
            while time.monotonic() < deadline:
                time.sleep(0.5)
                if scrape_passes(port, "demand-planner").total >= started + 3:
                    break
            # The planner alone: its passes over the demands there are.
            before = scrape_passes(port, "demand-planner")
            rounds0 = asyncio.run(blocked_rounds(server.target))
            meter = CpuMeter(groups)
            meter.start()
            t0 = time.monotonic()
            time.sleep(window)
            window_cpu = meter.stop()
            rounds1 = asyncio.run(blocked_rounds(server.target))
            # Rounds each blocked demand was given per second: 1 / demand_interval when
            # every pass gives each one its round, half that when every second pass does.
            rate = (rounds1[0] - rounds0[0]) / max(rounds1[1], 1) / (time.monotonic() - t0)
            passes = passes_between(before, scrape_passes(port, "demand-planner"))
            # Then submissions one at a time (each new blocked one also costs the planner
            # its first round: the passes during them are shown apart).
            before = scrape_passes(port, "demand-planner")
            first = 2_000_000 if phase == "large" else 1_000_000  # ids no submission used
            probes = asyncio.run(probe_submissions(server.target, first, window))
            passes_probed = passes_between(before, scrape_passes(port, "demand-planner"))
            every = probes["accepted"] + probes["blocked"]
            out[phase] = {
                "demands": count_rows(db.url, "demand"),
                "burst_p50_ms": round(pct(times, 0.5), 2),
                "burst_p99_ms": round(pct(times, 0.99), 2),
                "burst_per_s": round(len(times) / max(submit_s, 1e-9), 1),
                "submit_p50_ms": round(pct(every, 0.5), 2),
                "submit_p99_ms": round(pct(every, 0.99), 2),
                "submit_p99_accepted_ms": round(pct(probes["accepted"], 0.99), 2),
                "submit_p99_blocked_ms": round(pct(probes["blocked"], 0.99), 2),
                "probes": len(every),
                "planner": passes,
                "planner_while_submitting": passes_probed,
                "blocked_rounds_per_s": round(rate, 2),
                "cpu_submitting": submit_cpu,
                "cpu_window": window_cpu,
            }
            progress(f"demands, {phase}", out[phase])
    return out
