"""Heartbeats under user load: the agents' beats while users do their worst.

    python -m bench.heartbeats_under_load [--agents 1000] [--clients 64] [--senders 4]
        [--seconds 25] [--intervals N] [--loadgen native|python] [--database-url URL]
        [--server-arg=--flag --server-arg=value ...]

On a private embedded PostgreSQL (or a throwaway database on --database-url), one
rm-server (its defaults: one listener, authentication off on loopback), seeded as
bench.apply_cycle seeds it. In one window, at once:

- K simulated agents (default 1,000) beat every 3 s on a HeartbeatStream each, paced
  as the agent paces them (bench.loadgen / bench/native);
- N clients (default 64) loop Apply -> ReportUsed -> Release on the user labels;
- four threads each send GetLabelResource requests of 4 MiB in a loop, every one
  refused (RESOURCE_EXHAUSTED: larger than a user call may be);
- one user submits, one after the other, demands whose start window is the largest
  the time language allows (`--intervals`; default the language's interval limit, or
  4,096 on a version without one: 64 groups of 64 in nested ORs, ~61,000 characters,
  inside that version's every documented limit);
- one prober calls the standard health Check every 50 ms.

Reported: heartbeat p50 / p99 / max, late beats, agents marked LOST although they kept
beating; apply cycles per second; the refusals, the demands submitted and how long a
submission took; the health check's p99; the CPU of the RM, PostgreSQL and the load.
Target: heartbeat p99 < 100 ms on the 2-core machine. Prints a table and one JSON line.

    python -m bench.heartbeats_under_load attack ...   (internal: the senders, the
                                                        demand user and the prober)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from bench.apply_cycle import seed
from bench.common import (
    ROOT,
    CpuMeter,
    collect,
    emit,
    ms,
    pct,
    spawn_loadgen,
    stack,
    table,
)
from bench.heartbeats import ecm_states
from bench.serving import free_port

MiB = 1 << 20
TARGET_P99_MS = 100.0


def largest_window() -> int:
    """The most intervals a start window may hold (4,096 before the language had a limit:
    what 64 KiB of text, 64 operands per OR and 32 levels allowed in practice)."""
    try:
        from rm_server.domain.demands.timelang import MAX_INTERVALS
    except ImportError:
        return 4096
    return int(MAX_INTERVALS)


def window_text(intervals: int) -> str:
    """``intervals`` one-minute spans two minutes apart, in nested ORs of 64."""
    spans = [f"[+{2 * k}m, +1m]" for k in range(intervals)]
    groups = ["{OR: [" + ", ".join(spans[i : i + 64]) + "]}" for i in range(0, intervals, 64)]
    return "{Start: {OR: [" + ", ".join(groups) + "]}}"


# ----- the attacker process -------------------------------------------------------------------


def big_requests(target: str, start: float, end: float, out: dict[str, int]) -> None:
    """One thread: 4 MiB GetLabelResource requests in a loop (until `end`, monotonic)."""
    import grpc
    from labelrm.v1 import resource_manager_pb2 as pb
    from labelrm.v1 import resource_manager_pb2_grpc, resource_pb2

    options = [("grpc.max_send_message_length", 8 * MiB)]
    value = "x" * (4 * MiB - 4096)
    request = pb.GetLabelResourceRequest(
        labels=[resource_pb2.Label(key="userCreator", value=value)]
    )
    with grpc.insecure_channel(target, options=options) as channel:
        stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        while time.monotonic() < end:
            try:
                stub.GetLabelResource(request, timeout=60)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            if time.monotonic() >= start:
                out[code] = out.get(code, 0) + 1


async def demands(target: str, start: float, end: float, intervals: int) -> dict[str, Any]:
    """One user submitting the largest demands, one after the other."""
    import grpc
    from labelrm.v1 import demand_pb2 as dpb
    from labelrm.v1 import demand_pb2_grpc, resource_pb2

    from bench.loadgen import ENGINE, labels_of

    text = window_text(intervals)
    labels = labels_of(f"userCreator=demo-IDE,engineType={ENGINE}")
    resource = resource_pb2.Resource(load=resource_pb2.LoadResource(memory_bytes=1, cpu_millis=1))
    codes: dict[str, int] = {}
    seconds: list[float] = []
    n = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = demand_pb2_grpc.DemandServiceStub(channel)
        while time.monotonic() < end:
            n += 1
            request = dpb.SubmitDemandRequest(
                demand_id=f"largest-{os.getpid()}-{n}",
                user="demo",
                labels=labels,
                resource=resource,
                time_conditions_text=text,
            )
            t0 = time.monotonic()
            try:
                await stub.SubmitDemand(request, timeout=120)
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            if t0 >= start:
                codes[code] = codes.get(code, 0) + 1
                seconds.append(time.monotonic() - t0)
    return {"codes": codes, "seconds": seconds, "characters": len(text)}


async def prober(target: str, start: float, end: float) -> list[float]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    out: list[float] = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < end:
            t0 = time.monotonic()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=120)
            if t0 >= start:
                out.append(time.monotonic() - t0)
            await asyncio.sleep(max(0.0, t0 + 0.05 - time.monotonic()))
    return out


async def seeded_ecms(target: str, end: float) -> None:
    """Heartbeats for the ECMs bench.apply_cycle.seed registered (the apply cycles'
    emInstance labels), as their agents would send them, so that none goes LOST."""
    import grpc
    from labelrm.v1 import resource_manager_pb2 as pb
    from labelrm.v1 import resource_manager_pb2_grpc

    from bench.loadgen import ECMS, ecm_name

    sequence = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        while time.monotonic() < end:
            sequence += 1
            beats = [
                stub.Heartbeat(pb.HeartbeatRequest(agent_id=ecm_name(i), sequence=sequence))
                for i in range(ECMS)
            ]
            await asyncio.gather(*beats, return_exceptions=True)
            await asyncio.sleep(2.0)


async def attack_async(args: argparse.Namespace) -> dict[str, Any]:
    start = time.monotonic() + (args.start_at - time.time())
    end = start + args.seconds
    beating = asyncio.create_task(seeded_ecms(args.agent_target, end))
    refusals: list[dict[str, int]] = [{} for _ in range(args.senders)]
    threads = [
        threading.Thread(target=big_requests, args=(args.target, start, end, r), daemon=True)
        for r in refusals
    ]
    for t in threads:
        t.start()
    submitted, health = await asyncio.gather(
        demands(args.target, start, end, args.intervals), prober(args.target, start, end)
    )
    for t in threads:
        await asyncio.to_thread(t.join, 180)
    await beating
    merged: dict[str, int] = {}
    for r in refusals:
        for code, count in r.items():
            merged[code] = merged.get(code, 0) + count
    return {"big_requests": merged, "demands": submitted, "health": health}


# ----- the benchmark -----------------------------------------------------------------------------


def spawn_attacker(
    target: str, agent_target: str, start_at: float, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "bench.heartbeats_under_load", "attack", "--target", target]
    cmd += ["--agent-target", agent_target]
    cmd += ["--start-at", repr(start_at), "--seconds", str(args.seconds)]
    cmd += ["--senders", str(args.senders), "--intervals", str(args.intervals)]
    env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, env=env)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    native = args.loadgen == "native"
    server_args = list(args.server_arg)
    agent_port = 0
    if not args.one_listener:  # agents on a listener of their own, as in production
        agent_port = free_port()
        server_args += ["--agent-listen", f"127.0.0.1:{agent_port}"]
    with stack(args.database_url, server_args) as (db, server):
        agent_target = f"127.0.0.1:{agent_port}" if agent_port else server.target
        asyncio.run(seed(server.target))
        # Registration of the agents is the warm-up (they beat as soon as registered).
        warmup = 6.0 + args.agents / 80
        start_at = time.time() + warmup + 1.0
        per_proc = 2500 if native else 1250
        agents = spawn_loadgen(
            "heartbeat", agent_target, args.agents, args.seconds, start_at,
            procs=max(2, (args.agents + per_proc - 1) // per_proc), native=native,
            extra=["--agent-prefix", "load-"],
        )  # fmt: skip
        appliers = spawn_loadgen(
            "apply", server.target, args.clients, args.seconds, start_at, procs=2, native=native
        )
        attacker = spawn_attacker(server.target, agent_target, start_at, args)
        time.sleep(max(0.0, start_at - time.time() - 0.3))
        pids = [c.pid for c in (*agents, *appliers, attacker)]
        meter = CpuMeter({"server": server.pids, "postgres": db.postgres_pids(), "load": pids})
        time.sleep(max(0.0, start_at - time.time()))
        meter.start()
        time.sleep(args.seconds)
        cpu = meter.stop()
        limit = args.seconds + warmup + 300
        beats, cycles = collect(agents, limit), collect(appliers, limit)
        out, _ = attacker.communicate(timeout=limit)
        attack = json.loads(out.decode().strip().splitlines()[-1])
        states = asyncio.run(ecm_states(server.target, "load-"))
        listeners = "agents on agent_listen" if agent_port else "one listener"
        describe = db.describe
    values = beats["latency"].get("Heartbeat", [])
    submissions = attack["demands"]["seconds"]
    return {
        "database": describe,
        "listeners": listeners,
        "agents": args.agents,
        "clients": args.clients,
        "senders": args.senders,
        "intervals": args.intervals,
        "window_characters": attack["demands"]["characters"],
        "heartbeats_per_s": round(beats["count"] / beats["seconds"], 1),
        "expected_per_s": round(args.agents / 3.0, 1),
        "p50_ms": round(pct(values, 0.5), 2),
        "p99_ms": round(pct(values, 0.99), 2),
        "max_ms": round(max(values) * 1000, 1) if values else None,
        "late_beats": beats.get("extra", {}).get("late", 0),
        "lost": states.get("LOST", 0),
        "heartbeat_errors": beats["errors"],
        "cycles_per_s": round(cycles["count"] / cycles["seconds"], 1),
        "apply_errors": cycles["errors"],
        "big_requests": attack["big_requests"],
        "demands": attack["demands"]["codes"],
        "demand_submit_p50_ms": round(pct(submissions, 0.5), 1),
        "demand_submit_max_ms": round(max(submissions) * 1000, 1) if submissions else None,
        "health_p99_ms": round(pct(attack["health"], 0.99), 2),
        "health_max_ms": round(max(attack["health"]) * 1000, 1) if attack["health"] else None,
        "cpu": cpu,
        "target_p99_ms": TARGET_P99_MS,
    }


def report(r: dict[str, Any], seconds: float) -> None:
    met = r["p99_ms"] < TARGET_P99_MS and r["lost"] == 0
    rows = [
        ["heartbeat p50 / p99 / max ms", f"{ms(r['p50_ms'])} / {ms(r['p99_ms'])} / {r['max_ms']}"],
        ["heartbeats/s (expected)", f"{r['heartbeats_per_s']} ({r['expected_per_s']})"],
        ["late beats / agents LOST while beating", f"{r['late_beats']} / {r['lost']}"],
        ["apply cycles/s", r["cycles_per_s"]],
        ["4 MiB requests (by status)", r["big_requests"]],
        ["largest demands submitted (by status)", r["demands"]],
        ["demand submission p50 / max ms", f"{r['demand_submit_p50_ms']} / {r['demand_submit_max_ms']}"],
        ["health check p99 / max ms", f"{ms(r['health_p99_ms'])} / {r['health_max_ms']}"],
        ["CPU RM / pg / load / other", " / ".join(str(r["cpu"].get(k)) for k in ("server", "postgres", "load", "other"))],
    ]  # fmt: skip
    text = "\n".join(
        [
            f"heartbeats under load: {r['database']}; {r['listeners']}; {r['agents']} agents"
            " beating every 3 s,"
            f" {r['clients']} apply clients, {r['senders']} threads of 4 MiB requests, one user"
            f" submitting demands of {r['intervals']} intervals ({r['window_characters']}"
            f" characters); window {seconds:g} s",
            table(["measure", "value"], rows),
            f"target: heartbeat p99 < {TARGET_P99_MS:g} ms, no agent LOST: {'met' if met else 'NOT met'}",
            *(
                [f"DISTURBED: {r['cpu'].get('other')} cores busy with something else (> 0.2)"]
                if (r["cpu"].get("other") or 0.0) > 0.2
                else []
            ),
        ]
    )
    emit("heartbeats_under_load", text, r)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["attack"]:
        p = argparse.ArgumentParser(prog="bench.heartbeats_under_load attack")
        p.add_argument("--target", required=True)
        p.add_argument("--agent-target", required=True)
        p.add_argument("--start-at", type=float, required=True)
        p.add_argument("--seconds", type=float, required=True)
        p.add_argument("--senders", type=int, default=4)
        p.add_argument("--intervals", type=int, required=True)
        print(json.dumps(asyncio.run(attack_async(p.parse_args(argv[1:])))), flush=True)
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--intervals", type=int, default=largest_window())
    parser.add_argument("--loadgen", choices=["native", "python"], default="native")
    parser.add_argument(
        "--one-listener",
        action="store_true",
        help="agents on the users' listener (a version without a plaintext agent_listen)",
    )
    parser.add_argument("--database-url", default="")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra rm-server argument (repeat)"
    )
    args = parser.parse_args(argv)
    report(measure(args), args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
