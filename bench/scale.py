"""Cost as the cluster grows: each cost measured on a small and a large cluster in the
same run, printed as large / small ratios against their targets.

    python -m bench.scale [--quick] [--database-url URL] [--seconds 6]
                          [--parts cluster heartbeats demands memory retention agent-memory]

One embedded PostgreSQL (or a throwaway database on --database-url) and one rm-server
(ECM expiry 1 day: the bench ECMs do not heartbeat), then:

- apply: 64 clients, spread and hot (bench/native/loadgen.cc), first on the small cluster
  (1,000 user labels, empty ticket_history), then with 100,000 user label records (the
  load spread over all of them), then with 10 million ticket_history rows as well
  (--quick: 200,000; --history-rows N), all seeded with SQL (INSERT ... SELECT
  generate_series). Target: each / small >= 0.9 in cycles/s, cycle p99 <= 1.2 x.
- sweep: the ECM liveness sweep's query (rm_server/store/ecms.py) with 10,000 and with
  100,000 healthy ECMs (seeded with SQL): the database pages it reads (EXPLAIN ANALYZE
  BUFFERS) and its time. Target: does not grow with the healthy ECMs (at most one page
  more: a level of the index's B-tree; a scan of every ECM reads ten times the pages).
- heartbeats: simulated agents (bench/heartbeats.py) at 3 s on a fresh server, a small and
  a large fleet (1,000 and 10,000; --quick 100 and 1,000): p99, LOST (missed expiries).
  The liveness sweep's passes as the server times them (labelrm_background_pass_seconds)
  during each window (with the registrations and the beats on the same loop), and apart:
  in a quiet window right after each fleet stopped, its agents registered and still
  healthy, nothing else running. Target: the pass apart does not grow with the healthy
  ECMs. Then the large fleet once more on two rm-server processes sharing the port
  (replicas on one host): one process is one event loop, at most a core.
- demands: with a tenth, then all of 10,000 accepted demands (start in two hours) and
  1,000 blocked ones (due now on one label an ordinary ticket fills; --quick 1,000 and
  100), submitted 16 at a time (the burst: its latency and rate are shown, not a
  target); once every blocked demand has had its first round, a window in which
  the planner runs alone: its passes (the same metric; target p99 < 200 ms), the rounds
  each blocked demand gets per second, the CPU (with `other`: the rest of the machine);
  then a window in which submissions come one at a time (accepted and blocked in turn):
  their p99 (target < 50 ms).
- lists: ListLabelResources through 100,000 labels and ListTickets through 1,000,000 live
  tickets (--quick: 100,000; seeded with SQL, deleted afterwards), pages of 500: p50 and
  p99 of the last tenth of the pages / of the first tenth, target <= 1.2 x (keyset
  pagination); p99 of every page < 20 ms.
- memory: a fresh rm-server on 100,000 user labels, the apply load (spread) until
  1,000,000 cycles (--quick: 10,000), its RSS sampled after 10,000, 30,000, 100,000,
  300,000 and 1,000,000 (15 minutes at 1,100 cycles/s, 50 at 333). Target: after
  1,000,000 <= 1.2 x after 10,000 (no leak).
- retention: a compressed-clock run on a fresh server whose retention (history and request
  ids) is a few seconds instead of 30 days / 48 hours: the hot load for several retention
  periods while the rows of ticket_history and request_log are counted. Target: the rows in
  the last period <= 1.2 x those in the second (bounded, not growing with the run).
- agent memory: a real ecm-agent (as bench/launch.py starts it: root, sudo as lrmtest_a)
  launches and kills EngineConns, 8 at a time; its RSS after N launches and after 10 x N
  (N = 1,000; --quick 100), nothing live at either point (bench/scale_agent.py). Target
  <= 1.2 x. Skipped (not failed) without root, the test users or the EngineConn runtime.

Prints one table of ratios (target met yes/NO) and one JSON line. The measurements are in
bench/scale_measure.py, the seeding and workloads in bench/scale_parts.py.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.apply_cycle import seed
from bench.common import BenchDatabase, Server, emit, stack, table
from bench.heartbeats import measure as measure_heartbeats
from bench.scale_agent import agent_memory_run, agent_memory_target
from bench.scale_measure import (
    MEMORY_CHECKPOINTS,
    QUICK_MEMORY_CHECKPOINTS,
    apply_run,
    memory_run,
    page_through,
    retention_run,
    sweep_cost,
)
from bench.scale_parts import (
    LARGE_USERS,
    PAGE,
    SMALL_USERS,
    clone_rows,
    demand_run,
    drop_seeded_tickets,
    grow_user_labels,
    idle_passes,
    passes_between,
    progress,
    scrape_passes,
    seed_healthy_ecms,
    seed_tickets,
    sweep_apart,
)

# ----- the run ------------------------------------------------------------------------------

# rm-server processes sharing the port in the large fleet's second heartbeat run
REPLICAS = 2
PARTS = ("cluster", "heartbeats", "demands", "memory", "retention", "agent-memory")


def ratio(large: float, small: float) -> float | None:
    return round(large / small, 2) if small else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, shorter windows")
    parser.add_argument("--database-url", default="")
    parser.add_argument(
        "--seconds", type=float, default=0.0, help="apply window (default 6, quick 3)"
    )
    parser.add_argument(
        "--history-rows", type=int, default=0, help="ticket_history rows of the large cluster"
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="what to run (default: all): cluster (apply, sweep query, lists),"
        " heartbeats, demands, memory, retention, agent-memory",
    )
    args = parser.parse_args(argv)
    q = args.quick
    seconds = args.seconds or (3.0 if q else 6.0)
    history_rows = args.history_rows or (200_000 if q else 10_000_000)
    tickets = 100_000 if q else 1_000_000
    ecms_small, ecms_large = 10_000, 100_000
    fleets = (100, 1000) if q else (1000, 10_000)
    rows: list[list[Any]] = []
    out: dict[str, Any] = {"quick": q}

    def target(name: str, value: float | None, met: bool | None, note: str = "") -> None:
        rows.append([name, value, {True: "yes", False: "NO", None: "-"}[met], note])

    def cluster_part() -> None:
        # (a) apply, (b) the sweep's query, (d) lists: one server, grown with SQL
        from bench.serving import free_port

        metrics_port = free_port()
        server_args = ["--ecm-expiry", "86400", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
        with stack(args.database_url, server_args) as (db, server):
            asyncio.run(seed(server.target))
            out["database"] = db.describe
            # (a) the apply cycle, small cluster (after a warm-up run whose figures are dropped:
            # the first run on a fresh server and database would be the slowest of all)
            apply_run(db, server, "spread", SMALL_USERS, 2.0)
            small = {m: apply_run(db, server, m, SMALL_USERS, seconds) for m in ("spread", "hot")}
            progress("apply, small cluster", small)
            seed_healthy_ecms(db.url, ecms_small)
            out["sweep_small"] = sweep_cost(db.url)
            # The pass as the idle server runs it each second (no load, no registration).
            out["sweep_small"]["pass"] = idle_passes(metrics_port)
            # grow it with SQL: first the label records (the load spread over all of them),
            # then the history rows; each step measured
            seeded = {"labels_s": grow_user_labels(db)}
            labels = {m: apply_run(db, server, m, LARGE_USERS, seconds) for m in ("spread", "hot")}
            progress("apply, 100,000 labels", labels)
            # History rows as the RM makes them: ids in the order they were made (the time
            # in milliseconds first, rm_server/clock.py), ended over the last ten days.
            seeded["history_s"] = clone_rows(
                db.url,
                "ticket_history",
                "true",
                {
                    "ticket_id": "'t-' || lpad(to_hex((extract(epoch FROM t.ended_at"
                    f" - ({history_rows} - g) * interval '86 ms') * 1000)::bigint), 12, '0')"
                    " || substr(md5(g::text), 1, 20)",
                    "ended_at": f"t.ended_at - ({history_rows} - g) * interval '86 ms'",
                },
                history_rows,
            )
            out["seeded"] = seeded
            progress("seeded (seconds)", seeded)
            # A dropped run first here too: the first window after loading 10 million rows
            # touched a third more database pages per cycle than the next window on the same
            # data, which touched as many as the small cluster's (the cost measured is the
            # cluster's size, not the aftermath of loading it).
            apply_run(db, server, "spread", LARGE_USERS, 2.0)
            large = {m: apply_run(db, server, m, LARGE_USERS, seconds) for m in ("spread", "hot")}
            out["apply"] = {"small": small, "labels": labels, "large": large}
            progress("apply, 100,000 labels and the history", large)
            for m in ("spread", "hot"):
                for big, what in (
                    (labels, "100,000 labels"),
                    (large, f"100,000 labels + {history_rows:,} history rows"),
                ):
                    tput = ratio(big[m]["cycles_per_s"], small[m]["cycles_per_s"])
                    p99 = ratio(big[m]["cycle_p99_ms"], small[m]["cycle_p99_ms"])
                    target(
                        f"apply {m}, {what} / small: cycles/s >= 0.9",
                        tput,
                        tput is not None and tput >= 0.9,
                        f"{small[m]['cycles_per_s']} -> {big[m]['cycles_per_s']}/s",
                    )
                    target(
                        f"apply {m}, {what} / small: cycle p99 <= 1.2",
                        p99,
                        p99 is not None and p99 <= 1.2,
                        f"{small[m]['cycle_p99_ms']} -> {big[m]['cycle_p99_ms']} ms",
                    )
            # (b) the liveness sweep vs healthy ECMs
            seed_healthy_ecms(db.url, ecms_large)
            out["sweep_large"] = sweep_cost(db.url)
            out["sweep_large"]["pass"] = idle_passes(metrics_port)
            s_small, s_large = out["sweep_small"], out["sweep_large"]
            ps, pl = s_small["pass"]["mean_ms"], s_large["pass"]["mean_ms"]
            x = ratio(pl, ps) if ps and pl else None
            target(
                "liveness pass on the idle server, mean: 100,000 / 10,000 healthy ECMs <= 1.2",
                x,
                x is not None and x <= 1.2,
                f"{ps} -> {pl} ms ({s_small['pass']['passes']}, {s_large['pass']['passes']} passes)",
            )
            progress("liveness sweep", [s_small, s_large])
            pages = ratio(s_large["pages"], s_small["pages"])
            target(
                # An index lookup reads one page per level of its B-tree: ten times the rows
                # may add a level. Met when it read at most that one page more (a scan of
                # every ECM reads ten times the pages).
                "liveness sweep: pages read, 100,000 / 10,000 healthy ECMs (<= one more level)",
                pages,
                s_large["pages"] <= s_small["pages"] + 1,
                f"{s_small['pages']} -> {s_large['pages']} pages (a scan of every ECM: {s_small['scan_pages']} -> {s_large['scan_pages']}),"
                f" p50 {s_small['p50_ms']} -> {s_large['p50_ms']} ms",
            )
            # (d) lists
            template = seed_tickets(db, server, tickets)
            lists = {
                "labels": asyncio.run(page_through(server.target, "labels")),
                "tickets": asyncio.run(page_through(server.target, "tickets")),
            }
            drop_seeded_tickets(db, server, template)
            out["lists"] = lists
            progress("lists", lists)
            for name, r in lists.items():
                for stat in ("p50", "p99"):
                    x = ratio(r[f"last_{stat}_ms"], r[f"first_{stat}_ms"])
                    target(
                        f"list {name}: last/first tenth of the pages, {stat} <= 1.2",
                        x,
                        x is not None and x <= 1.2,
                        f"{r['items']} in {r['pages']} pages of {PAGE},"
                        f" {r[f'first_{stat}_ms']} -> {r[f'last_{stat}_ms']} ms",
                    )
                target(
                    f"list {name}: p99 per page of {PAGE} < 20 ms",
                    r["p99_ms"],
                    r["p99_ms"] < 20,
                    "every page",
                )

    def memory_part() -> None:
        # (e) memory: a fresh server (no other part's high-water marks in its heap) on the
        # large cluster's user labels, sampled as the apply cycles accumulate
        with stack(args.database_url, ["--ecm-expiry", "86400"]) as (db, server):
            asyncio.run(seed(server.target))
            grow_user_labels(db)
            samples = memory_run(db, server, QUICK_MEMORY_CHECKPOINTS if q else MEMORY_CHECKPOINTS)
        out["memory"] = samples
        first, last = samples[0], samples[-1]
        x = ratio(last["rss_mib"], first["rss_mib"])
        target(
            f"rm-server RSS after {last['cycles']:,} / after {first['cycles']:,} cycles <= 1.2",
            x,
            x is not None and x <= 1.2,
            " -> ".join(f"{s['rss_mib']} MiB @{s['cycles']:,}" for s in samples),
        )

    def fleet(server: Server, db: BenchDatabase, n: int, prefix: str) -> dict[str, Any]:
        # n simulated agents at 3 s, a load-generator process per 2,500 (as bench.heartbeats)
        return measure_heartbeats(
            server,
            db,
            n,
            10.0 if q else 20.0,
            3.0,
            max(2, -(-n // 2500)),
            prefix,
            "native",
            "stream",
        )

    def heartbeats_part() -> None:
        # (b) heartbeats: a fresh server with the default liveness settings
        from bench.serving import free_port

        metrics_port = free_port()
        hb = []
        with stack(args.database_url, ["--metrics-listen", f"127.0.0.1:{metrics_port}"]) as (
            db,
            server,
        ):
            out.setdefault("database", db.describe)
            for i, n in enumerate(fleets):
                before = scrape_passes(metrics_port, "liveness")
                r = fleet(server, db, n, f"s{i}-")
                # The liveness pass under the load, registrations included (the window's)...
                r["liveness_passes"] = passes_between(
                    before, scrape_passes(metrics_port, "liveness")
                )
                # ...and apart: right after the fleet stopped, with its agents registered
                # and healthy (not silent past the 30 s expiry yet) and nothing else running.
                r["sweep_apart"] = sweep_apart(db, metrics_port, f"s{i}-")
                hb.append(r)
        # The large fleet again on two rm-server processes sharing the port (replicas on
        # one host, as an operator would run them for a fleet this size): one process is
        # one event loop, at most one core, and serves the beats but with a tail.
        with stack(args.database_url, [], workers=REPLICAS) as (db, server):
            replicas = fleet(server, db, fleets[1], "r-")
        out["heartbeats"] = hb
        out["heartbeats_replicas"] = replicas
        progress(
            "heartbeats",
            [
                {
                    k: r[k]
                    for k in (
                        "agents",
                        "heartbeats_per_s",
                        "p50_ms",
                        "p99_ms",
                        "lost",
                        "liveness_passes",
                        "sweep_apart",
                    )
                }
                for r in hb
            ],
        )
        x = ratio(hb[1]["p99_ms"], hb[0]["p99_ms"])
        target(
            f"heartbeats: p99 {fleets[1]} agents < 50 ms, one rm-server process",
            hb[1]["p99_ms"],
            hb[1]["p99_ms"] < 50,
            f"{fleets[0]} agents {hb[0]['p99_ms']} ms, ratio {x};"
            f" {hb[1]['heartbeats_per_s']} of {hb[1]['expected_per_s']} beats/s;"
            f" RM {hb[1]['cpu'].get('server')} cores, {hb[1]['server_cpu_us_per_beat']} us/beat;"
            f" other CPU {hb[1]['cpu'].get('other')}",
        )
        target(
            f"heartbeats: p99 {fleets[1]} agents < 50 ms, {REPLICAS} rm-server processes",
            replicas["p99_ms"],
            replicas["p99_ms"] < 50,
            f"p50 {replicas['p50_ms']} ms; {replicas['heartbeats_per_s']} of"
            f" {replicas['expected_per_s']} beats/s; RM {replicas['cpu'].get('server')} cores"
            f" in all, {replicas['server_cpu_us_per_beat']} us/beat;"
            f" other CPU {replicas['cpu'].get('other')}",
        )
        target(
            f"heartbeats: no missed expiry with {fleets[1]} agents",
            hb[1]["lost"] + replicas["lost"],
            hb[1]["lost"] + replicas["lost"] == 0,
            f"one process {hb[1]['lost']} LOST, {REPLICAS} processes {replicas['lost']}",
        )
        sw = [r["sweep_apart"] for r in hb]
        means = [w["mean_ms"] for w in sw]
        x = ratio(means[1], means[0]) if None not in means else None
        target(
            f"liveness pass apart, mean: {sw[1]['healthy']} / {sw[0]['healthy']} healthy ECMs <= 1.2",
            x,
            x is not None and x <= 1.2,
            f"{sw[0]['mean_ms']} -> {sw[1]['mean_ms']} ms ({sw[0]['passes']}, {sw[1]['passes']}"
            f" passes; p99 <= {sw[0]['p99_le_ms']} -> <= {sw[1]['p99_le_ms']} ms)",
        )
        lp = [r["liveness_passes"]["p99_le_ms"] for r in hb]
        target(
            f"liveness pass p99 under the load (histogram bound), {fleets[0]} -> {fleets[1]} agents",
            ratio(lp[1], lp[0]) if None not in lp else None,
            None,
            f"{lp[0]} -> {lp[1]} ms ({hb[1]['liveness_passes']['passes']} passes,"
            " registrations and beats on the same loop: not the pass's own cost)",
        )

    def demands_part() -> None:
        # (c) demands
        dem = demand_run(args.database_url, 1_000 if q else 10_000, 100 if q else 1_000, 10.0)
        out["demands"] = dem
        ds, dl = dem["small"], dem["large"]
        target(
            f"demands: planner pass p99 with {dem['accepted']} accepted, {dem['blocked']} blocked < 200 ms",
            dl["planner"]["p99_le_ms"],
            dl["planner"]["p99_le_ms"] is not None and dl["planner"]["p99_le_ms"] <= 200,
            f"histogram bucket bounds; {ds['demands']} demands: p99 <= {ds['planner']['p99_le_ms']} ms,"
            f" {dl['demands']}: <= {dl['planner']['p99_le_ms']} ms ({dl['planner']['passes']} passes);"
            f" mean {ds['planner']['mean_ms']} -> {dl['planner']['mean_ms']} ms;"
            f" blocked demands' rounds/s {ds['blocked_rounds_per_s']} -> {dl['blocked_rounds_per_s']};"
            f" while submissions come one at a time: p99 <= {dl['planner_while_submitting']['p99_le_ms']} ms;"
            f" other CPU {dl['cpu_window']['other']} cores",
        )
        target(
            f"demands: SubmitDemand p99 with {dl['demands']} demands < 50 ms",
            dl["submit_p99_ms"],
            dl["submit_p99_ms"] < 50,
            f"one at a time ({dl['probes']} probes; accepted {dl['submit_p99_accepted_ms']} ms,"
            f" on the blocked label {dl['submit_p99_blocked_ms']} ms); {ds['demands']} demands:"
            f" {ds['submit_p99_ms']} ms; ratio {ratio(dl['submit_p99_ms'], ds['submit_p99_ms'])};"
            f" burst of 16 in flight: p99 {ds['burst_p99_ms']} -> {dl['burst_p99_ms']} ms,"
            f" {ds['burst_per_s']} -> {dl['burst_per_s']}/s; other CPU {dl['cpu_window']['other']} cores",
        )

    def retention_part() -> None:
        # (f) retention
        ret = retention_run(args.database_url, 8.0 if q else 20.0, 4 if q else 6)
        out["retention"] = ret
        progress("retention", ret)
        hist = [s["ticket_history"] for s in ret["samples"]]
        reqs = [s["request_log"] for s in ret["samples"]]
        for name, series in (("ticket_history", hist), ("request_log", reqs)):
            x = ratio(series[-1], series[1])
            target(
                f"retention: {name} rows, last / second period <= 1.2",
                x,
                x is not None and x <= 1.2,
                f"rows per period: {series}",
            )

    def agent_memory_part() -> None:
        # (g) the ecm-agent's memory as launches accumulate (bench/scale_agent.py)
        first = 100 if q else 1_000
        mem = agent_memory_run(args.database_url, first, 10)
        out["agent_memory"] = mem
        progress("agent memory, done", {k: v for k, v in mem.items() if k != "samples"})
        target(*agent_memory_target(mem))

    if "cluster" in args.parts:  # the others' ratios are worth nothing if this fails
        cluster_part()
    for name, part in (
        ("heartbeats", heartbeats_part),
        ("demands", demands_part),
        ("memory", memory_part),
        ("retention", retention_part),
        ("agent-memory", agent_memory_part),
    ):
        if name not in args.parts:
            continue
        try:
            part()
        except Exception as exc:  # one part failing must not lose the others' figures
            progress(f"{name} failed", repr(exc))
            target(name, None, None, f"failed: {exc!r}")
    text = "cost as the cluster grows ({}; {}):\n".format(
        out.get("database", "-"), "quick" if q else "full"
    ) + table(["measure", "ratio", "met", "figures"], rows)
    emit(
        "scale",
        text,
        {
            **out,
            "targets": [
                dict(zip(["measure", "ratio", "met", "figures"], r, strict=True)) for r in rows
            ],
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
