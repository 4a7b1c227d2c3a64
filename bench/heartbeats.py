"""Heartbeats: K simulated agents on one RM, each heartbeating every 3 s.

    python -m bench.heartbeats [--agents 1000 5000] [--seconds 20] [--interval 3]
                               [--procs 4] [--database-url URL]

Starts a private embedded PostgreSQL (or a throwaway database on --database-url) and
an rm-server with its default liveness settings (ECM expiry 30 s, sweep every 1 s).
For each K, load-generator processes register K fresh agents (32 registrations in
flight per process; each agent starts beating as soon as it is registered, as a real
one does) and run them as the agent does with no EngineConn: heartbeat,
sequence-numbered, paced as the agent paces them (ecm_agent/pacing.py: each beat 3 s
after the last was sent, give or take 10 %). After a warm-up the window is measured:
heartbeats/s (against K / 3 expected), p50/p99 latency, late beats (answered an
interval or more after they were sent: the RM fell behind), the RM's CPU (psutil on
its pid) and the database's; then ListEcms tells how many of the agents the RM marked
LOST (each one a missed expiry: they all kept beating) and how many heartbeats were
told to re-register. Before the agents, the gRPC floor on the same, idle server: 64
clients calling the standard health Check (no database) for 4 s, the RM's CPU per empty
call; each row gives its CPU per heartbeat in those units, and the floor says how many
empty calls one core of this machine serves (one RM process cannot serve heartbeats
faster). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.apply_cycle import measure_floor
from bench.common import emit, ms, pct, run_loadgen, stack, table


async def ecm_states(target: str, prefix: str) -> dict[str, int]:
    import grpc
    from labelrm.v1 import resource_manager_pb2 as pb
    from labelrm.v1 import resource_manager_pb2_grpc

    states: dict[str, int] = {}
    async with grpc.aio.insecure_channel(target) as ch:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        token = ""
        while True:
            resp = await rm.ListEcms(
                pb.ListEcmsRequest(page_size=1000, page_token=token), timeout=60
            )
            for ecm in resp.ecms:
                if ecm.instance.startswith(prefix):
                    name = pb.EcmState.Name(ecm.state).removeprefix("ECM_STATE_")
                    states[name] = states.get(name, 0) + 1
            token = resp.next_page_token
            if not token:
                return states


def measure(
    server: Any,
    db: Any,
    agents: int,
    seconds: float,
    interval: float,
    procs: int,
    prefix: str,
    loadgen: str,
    heartbeat_rpc: str,
) -> dict[str, Any]:
    # Registration is part of the warm-up: the simulated agents of a load generator
    # register (at 70-400/s on the 2-core machine) and each beats once registered; the
    # output says if registration was not over when the window opened.
    warmup = 6.0 + agents / 80
    res, cpu = run_loadgen(
        "heartbeat",
        server.target,
        agents,
        seconds,
        warmup=warmup,
        procs=procs,
        extra=[
            "--interval",
            str(interval),
            "--agent-prefix",
            prefix,
            "--heartbeat-rpc",
            heartbeat_rpc,
        ],
        meter_groups=lambda: {"server": server.pids, "postgres": db.postgres_pids()},
        node={"interval": interval, "agent_prefix": prefix} if loadgen == "node" else None,
        native=loadgen == "native",
    )
    values = res["latency"].get("Heartbeat", [])
    states = asyncio.run(ecm_states(server.target, prefix))
    extra = res.get("extra", {})
    per_s = round(res["count"] / res["seconds"], 1)
    return {
        "agents": agents,
        "interval_s": interval,
        "expected_per_s": round(agents / interval, 1),
        "heartbeats_per_s": per_s,
        "p50_ms": round(pct(values, 0.5), 2),
        "p99_ms": round(pct(values, 0.99), 2),
        "max_ms": round(max(values) * 1000, 1) if values else None,
        "late_beats": extra.get("late", 0),
        "reregister": extra.get("HEARTBEAT_ACTION_REREGISTER", 0),
        "errors": res["errors"],
        "registered_after_s": res.get("registered_after"),
        "warmup_s": warmup,
        "lost": states.get("LOST", 0),
        "states": states,
        "cpu": cpu,
        "server_cpu_us_per_beat": cpu_per_call_us(cpu.get("server", 0.0), per_s),
    }


def cpu_per_call_us(cores: float, calls_per_s: float) -> float | None:
    """Microseconds of CPU per call, from cores used and calls per second."""
    return round(cores / calls_per_s * 1e6, 1) if calls_per_s else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument(
        "--procs",
        type=int,
        default=0,
        help="load-generator processes (default: 1 per 2500 agents in Node.js, 1 per 1250"
        " in Python, at least 2)",
    )
    parser.add_argument("--database-url", default="")
    parser.add_argument(
        "--loadgen",
        choices=["native", "node", "python"],
        default="native",
        help="simulated agents in C++ (bench/native/loadgen.cc, the default), Node.js"
        " (bench/nodejs/heartbeat.cjs) or Python (bench/loadgen.py)",
    )
    parser.add_argument(
        "--heartbeat-rpc",
        choices=["stream", "unary"],
        default="stream",
        help="beats on one HeartbeatStream per agent, as ecm-agent sends them (the default),"
        " or as unary Heartbeat calls (the Node.js simulator's only way)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="rm-server processes sharing the port (SO_REUSEPORT)"
    )
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra rm-server argument (repeat)"
    )
    args = parser.parse_args(argv)
    if args.loadgen == "node" and args.heartbeat_rpc == "stream":
        parser.error("--loadgen node sends unary Heartbeat calls: add --heartbeat-rpc unary")

    results = []
    with stack(args.database_url, args.server_arg, args.workers) as (db, server):
        # The floor first: after thousands of agents an overloaded RM may still be
        # answering their last beats.
        floor = measure_floor(db, server, 64, 4.0, 2, args.loadgen == "native")
        for n, agents in enumerate(args.agents):
            per_proc = 1250 if args.loadgen == "python" else 2500
            procs = args.procs or max(2, (agents + per_proc - 1) // per_proc)
            results.append(
                measure(
                    server,
                    db,
                    agents,
                    args.seconds,
                    args.interval,
                    procs,
                    f"sim{n}-",
                    args.loadgen,
                    args.heartbeat_rpc,
                )
            )
        describe = db.describe
    floor_us = cpu_per_call_us(floor["cpu"].get("server", 0.0), floor["rpcs_per_s"])
    floor["server_cpu_us_per_call"] = floor_us
    for r in results:
        r["beat_in_empty_rpcs"] = (
            round(r["server_cpu_us_per_beat"] / floor_us, 2)
            if r["server_cpu_us_per_beat"] and floor_us
            else None
        )
    rows = [
        [
            r["agents"],
            r["expected_per_s"],
            r["heartbeats_per_s"],
            ms(r["p50_ms"]),
            ms(r["p99_ms"]),
            r["late_beats"],
            r["lost"],
            r["reregister"],
            r["cpu"].get("server"),
            r["cpu"].get("postgres"),
            r["cpu"].get("loadgen"),
            r["cpu"].get("other"),
            r["server_cpu_us_per_beat"],
            r["beat_in_empty_rpcs"],
        ]
        for r in results
    ]
    text = "\n".join(
        [
            f"heartbeats: {describe}; rm-server defaults (ECM expiry 30 s, sweep 1 s); agents heartbeat every {args.interval:g} s ({'one HeartbeatStream each' if args.heartbeat_rpc == 'stream' else 'unary Heartbeat calls'}, {args.loadgen} simulator); window {args.seconds:g} s after registration and warm-up",
            table(
                [
                    "agents",
                    "expected/s",
                    "heartbeats/s",
                    "p50 ms",
                    "p99 ms",
                    "late",
                    "LOST",
                    "re-register",
                    "CPU RM",
                    "CPU pg",
                    "CPU gen",
                    "CPU other",
                    "RM us/beat",
                    "x empty",
                ],
                rows,
            ),
            "(LOST: agents the RM marked LOST although they kept beating = missed expiries; CPU in cores;"
            " RM us/beat: the RM's CPU per heartbeat, x empty: that in empty calls)",
            f"gRPC floor on the same server (health Check, 64 clients): {floor['rpcs_per_s']} calls/s,"
            f" p50 {ms(floor['p50_ms'])} ms, RM CPU {floor_us} us per call:"
            f" {round(1e6 / floor_us) if floor_us else '-'} empty calls per RM core-second on this machine",
            *[
                f"note: with {r['agents']} agents the last registration came {r['registered_after_s']} s after start, "
                f"after the {r['warmup_s']} s warm-up: the window includes registrations"
                for r in results
                if (r["registered_after_s"] or 0) > r["warmup_s"]
            ],
            *[f"errors with {r['agents']} agents: {r['errors']}" for r in results if r["errors"]],
        ]
    )
    emit(
        "heartbeats",
        text,
        {
            "database": describe,
            "heartbeat_rpc": args.heartbeat_rpc,
            "loadgen": args.loadgen,
            "results": results,
            "floor": floor,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
