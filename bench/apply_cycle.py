"""Apply -> ReportUsed -> Release cycles through the real gRPC server, against the
storage ceiling (pgbench running the same SQL) and the gRPC floor (an empty RPC).

    python -m bench.apply_cycle [--clients 1 16 64] [--seconds 6] [--mode spread|hot|both]
                                [--database-url URL] [--no-pgbench] [--no-floor]
                                [--server-arg=--flag --server-arg=value ...]

Starts a private embedded PostgreSQL (or makes a throwaway database on the server of
--database-url) and an rm-server subprocess on it, seeds 16 ECMs, a wildcard limit
and the 1000 userCreator+engineType label records, then for every mode and client
count:
- labelrm: N clients in separate load-generator processes (2 of them, each with its
  own event loop and channels; 1 for a single client) each loop Apply -> ReportUsed
  -> Release. Modes: `spread`, each cycle names one of the 1000 user labels and one of
  the 16 ECMs; `hot`, every cycle names the same ECM (one label every request locks);
- ceiling: pgbench runs bench/pgbench/cycle.sql (the store's SQL for the three RPCs)
  with N clients on the same database;
- floor: N clients call the standard health Check (no database) on the same server.
Prints a table, the CPU each part used (cores), and one JSON line; finally checks
the server's invariants (CheckConsistency) after all that load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench import ceiling
from bench.common import BenchDatabase, Server, emit, ms, pct, run_loadgen, stack, table
from bench.loadgen import ECMS, ENGINE, USERS, GiB, ecm_name, labels_of, user_label


async def seed(target: str) -> None:
    import grpc
    from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2_grpc, resource_pb2
    from labelrm.v1 import resource_manager_pb2 as pb

    async with grpc.aio.insecure_channel(target) as ch:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        big = resource_pb2.LoadInstanceResource(
            memory_bytes=1 << 50, cpu_millis=1 << 40, instances=1 << 30
        )
        for i in range(ECMS):
            await rm.RegisterEcm(
                pb.RegisterEcmRequest(
                    instance=ecm_name(i), total_resource=resource_pb2.Resource(load_instance=big)
                )
            )
        await admin.SetLabelLimit(
            admin_pb2.SetLabelLimitRequest(
                labels=labels_of("userCreator=*,engineType=*"),
                max_resource=resource_pb2.Resource(
                    load=resource_pb2.LoadResource(memory_bytes=1 << 50, cpu_millis=1 << 40)
                ),
            )
        )
        # Create the 1000 limit-backed label records up front: the measured runs are steady state.
        resource = resource_pb2.Resource(
            load=resource_pb2.LoadResource(memory_bytes=GiB, cpu_millis=100)
        )
        todo = list(range(USERS))

        async def worker() -> None:
            while todo:
                u = todo.pop()
                labels = labels_of(
                    f"userCreator={user_label(u)},engineType={ENGINE},emInstance={ecm_name(u % ECMS)}"
                )
                t = (await rm.Apply(pb.ApplyRequest(labels=labels, resource=resource))).ticket
                await rm.Release(pb.ReleaseRequest(ticket_id=t.ticket_id))

        await asyncio.gather(*(worker() for _ in range(16)))


async def consistency(target: str) -> dict[str, Any]:
    import grpc
    from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2_grpc
    from labelrm.v1 import resource_manager_pb2 as pb

    async with grpc.aio.insecure_channel(target) as ch:
        report = await admin_pb2_grpc.AdminServiceStub(ch).CheckConsistency(
            admin_pb2.CheckConsistencyRequest(), timeout=60
        )
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        live = (await rm.ListTickets(pb.ListTicketsRequest(page_size=10))).tickets
    return {
        "consistent": report.consistent,
        "mismatches": len(report.mismatches),
        "live_tickets_left": len(live),
    }


def measure_labelrm(
    db: BenchDatabase,
    server: Server,
    mode: str,
    clients: int,
    seconds: float,
    procs: int,
    native: bool,
) -> dict[str, Any]:
    assert server.proc is not None
    res, cpu = run_loadgen(
        "apply",
        server.target,
        clients,
        seconds,
        procs=procs,
        extra=["--mode", mode],
        meter_groups=lambda: {"server": server.pids, "postgres": db.postgres_pids()},
        native=native,
    )
    out: dict[str, Any] = {
        "cycles_per_s": round(res["count"] / res["seconds"], 1),
        "errors": res["errors"],
        "cpu": cpu,
    }
    for rpc in ("Apply", "ReportUsed", "Release"):
        values = res["latency"].get(rpc, [])
        out[f"{rpc}_p50_ms"] = round(pct(values, 0.5), 2)
        out[f"{rpc}_p99_ms"] = round(pct(values, 0.99), 2)
    return out


def measure_floor(
    db: BenchDatabase, server: Server, clients: int, seconds: float, procs: int, native: bool
) -> dict[str, Any]:
    assert server.proc is not None
    res, cpu = run_loadgen(
        "health",
        server.target,
        clients,
        seconds,
        procs=procs,
        meter_groups=lambda: {"server": server.pids},
        native=native,
    )
    values = res["latency"].get("Check", [])
    return {
        "rpcs_per_s": round(res["count"] / res["seconds"], 1),
        "p50_ms": round(pct(values, 0.5), 2),
        "p99_ms": round(pct(values, 0.99), 2),
        "cpu": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--mode", choices=["spread", "hot", "both"], default="both")
    parser.add_argument("--database-url", default="")
    parser.add_argument(
        "--procs",
        type=int,
        default=0,
        help="load-generator processes (default 2, 1 for one client)",
    )
    parser.add_argument("--no-pgbench", action="store_true")
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument(
        "--pgbench-script",
        default="",
        help="another ceiling script (e.g. bench/pgbench/cycle_v0.sql: the SQL of the first, unbatched store)",
    )
    parser.add_argument(
        "--loadgen",
        choices=["native", "python"],
        default="native",
        help="clients in C++ (bench/native/loadgen.cc, the default: the least CPU taken"
        " from the server's cores) or in Python (bench/loadgen.py)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="rm-server processes sharing the port (SO_REUSEPORT)"
    )
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra rm-server argument (repeat)"
    )
    args = parser.parse_args(argv)

    modes = ["spread", "hot"] if args.mode == "both" else [args.mode]
    native = args.loadgen == "native"
    # No agents heartbeat here: keep the bench ECMs from expiring during the run.
    server_args = ["--ecm-expiry", "86400", *args.server_arg]
    results: list[dict[str, Any]] = []
    floors: dict[int, dict[str, Any]] = {}
    # The ceiling script is generated from the store's SQL; the checked-in copy is for reading.
    if args.pgbench_script:
        script_text, stale = Path(args.pgbench_script).read_text(), False
    else:
        script_text = ceiling.cycle_script()
        stale = not ceiling.CYCLE.exists() or ceiling.CYCLE.read_text() != script_text
    tmpdir = Path(tempfile.mkdtemp(prefix="labelrm-bench-"))
    script = tmpdir / "cycle.sql"
    script.write_text(script_text)
    with stack(args.database_url, server_args, args.workers) as (db, server):
        asyncio.run(seed(server.target))
        if not args.no_pgbench:
            ceiling.prepare(db.url)
        for mode in modes:
            for clients in args.clients:
                row: dict[str, Any] = {"mode": mode, "clients": clients}
                db.settle()
                row["labelrm"] = measure_labelrm(
                    db, server, mode, clients, args.seconds, args.procs, native
                )
                if not args.no_pgbench:
                    ceiling.reset(db.url)
                    db.settle()
                    row["pgbench"] = ceiling.run(
                        db.pgbench,
                        db.url,
                        script,
                        clients,
                        args.seconds,
                        {"emax": 0 if mode == "hot" else ECMS - 1},
                        db.postgres_pids,
                    )
                    base = row["pgbench"].get("cycles_per_s") or 0
                    row["ratio"] = round(row["labelrm"]["cycles_per_s"] / base, 2) if base else None
                results.append(row)
        if not args.no_floor:
            for clients in args.clients:
                floors[clients] = measure_floor(
                    db, server, clients, min(args.seconds, 4.0), args.procs, native
                )
        check = asyncio.run(consistency(server.target))
        describe = db.describe
        pgbench = db.pgbench
    shutil.rmtree(tmpdir, ignore_errors=True)

    for row in results:
        f = floors.get(row["clients"])
        if f and row["labelrm"]["cycles_per_s"]:
            # One cycle is three RPCs: its cost in units of three empty RPCs.
            row["cycle_in_empty_rpc_triples"] = round(
                f["rpcs_per_s"] / 3 / row["labelrm"]["cycles_per_s"], 2
            )
    headers = [
        "mode",
        "clients",
        "cycles/s",
        "pgbench/s",
        "ratio",
        "Apply p50/p99",
        "Report p50/p99",
        "Release p50/p99",
        "x3 empty",
        "CPU srv/pg/gen/other",
        "CPU pg/pgb/other",
    ]
    rows = []
    for r in results:
        lr, pb = r["labelrm"], r.get("pgbench", {})
        rows.append(
            [
                r["mode"],
                r["clients"],
                lr["cycles_per_s"],
                pb.get("cycles_per_s", "-"),
                r.get("ratio", "-"),
                f"{ms(lr['Apply_p50_ms'])}/{ms(lr['Apply_p99_ms'])}",
                f"{ms(lr['ReportUsed_p50_ms'])}/{ms(lr['ReportUsed_p99_ms'])}",
                f"{ms(lr['Release_p50_ms'])}/{ms(lr['Release_p99_ms'])}",
                r.get("cycle_in_empty_rpc_triples", "-"),
                "/".join(
                    str(lr["cpu"].get(k, "-")) for k in ("server", "postgres", "loadgen", "other")
                ),
                "/".join(
                    str(pb.get("cpu", {}).get(k, "-")) for k in ("postgres", "pgbench", "other")
                ),
            ]
        )
    text = [
        f"apply cycle: {describe}; pgbench {pgbench or 'missing'} -M prepared running {args.pgbench_script or 'bench/pgbench/cycle.sql'}"
        + (" (checked-in copy is stale: run python -m bench.ceiling)" if stale else ""),
        f"load: {args.procs or 2} load-generator processes (1 for one client), measured {args.seconds:g}s after 2s warm-up; latencies in ms; CPU in cores",
        table(headers, rows),
    ]
    if floors:
        text.append("")
        text.append("gRPC floor (standard health Check, same server, same concurrency):")
        text.append(
            table(
                ["clients", "empty RPC/s", "p50 ms", "p99 ms", "CPU srv/gen/other"],
                [
                    [
                        c,
                        f["rpcs_per_s"],
                        ms(f["p50_ms"]),
                        ms(f["p99_ms"]),
                        f"{f['cpu'].get('server')}/{f['cpu'].get('loadgen')}/{f['cpu'].get('other')}",
                    ]
                    for c, f in floors.items()
                ],
            )
        )
    text.append("")
    text.append(
        f"after the load: CheckConsistency consistent={check['consistent']}, live tickets left={check['live_tickets_left']}"
    )
    if any(r["labelrm"]["errors"] for r in results):
        text.append(
            "errors: "
            + json.dumps(
                {
                    f"{r['mode']}/{r['clients']}": r["labelrm"]["errors"]
                    for r in results
                    if r["labelrm"]["errors"]
                }
            )
        )
    emit(
        "apply_cycle",
        "\n".join(text),
        {"database": describe, "results": results, "floor": floors, "consistency": check},
    )
    return 0 if check["consistent"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
