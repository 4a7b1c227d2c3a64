"""A load-generator process (started by the benchmarks, several at a time).

    python -m bench.loadgen apply|health|heartbeat --target HOST:PORT --clients N
           --seconds S --start-at EPOCH [--mode spread|hot] [--interval 3]
           [--heartbeat-rpc stream|unary] ...

Clients start at once (warm-up), are measured from --start-at for --seconds, and the
process prints one JSON line: operations completed in the window, latencies (s) of
calls that started in it, and error codes. Running the clients in their own processes
keeps their CPU off the server's interpreter; the benchmarks report both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
import uuid
from typing import Any

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc, resource_pb2

from ecm_agent.beats import HeartbeatSender
from ecm_agent.pacing import next_beat_delay

GiB = 1024**3
USERS = 1000
ECMS = 16
ENGINE = "spark-3.2.1"


def ecm_name(i: int) -> str:
    return f"bench{i}:9000"


def user_label(u: int) -> str:
    return f"u{u}-IDE"


class Window:
    def __init__(self, start_at: float, seconds: float) -> None:
        # Wall-clock start shared by all processes, turned into this process's monotonic clock.
        self.start = time.monotonic() + (start_at - time.time())
        self.end = self.start + seconds
        self.launched = time.monotonic()
        self.registered = 0.0  # seconds from launch until the last agent was registered
        self.count = 0
        self.latency: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.extra: dict[str, int] = {}

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end

    def record(self, rpc: str, t0: float, t1: float) -> None:
        if self.inside(t0):
            self.latency.setdefault(rpc, []).append(t1 - t0)

    def error(self, code: str, t: float) -> None:
        if self.inside(t):
            self.errors[code] = self.errors.get(code, 0) + 1

    def bump(self, key: str, t: float) -> None:
        if self.inside(t):
            self.extra[key] = self.extra.get(key, 0) + 1

    def result(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "seconds": self.end - self.start,
            "latency": {k: [round(x, 6) for x in v] for k, v in self.latency.items()},
            "errors": self.errors,
            "extra": self.extra,
            "registered_after": round(self.registered, 2),
        }


def labels_of(text: str) -> list[resource_pb2.Label]:
    return [
        resource_pb2.Label(key=k, value=v)
        for k, _, v in (p.partition("=") for p in text.split(","))
    ]


# Prebuilt label lists: building protobufs is client work, not the server's.
def _spread_labels() -> list[list[list[resource_pb2.Label]]]:
    return [
        [
            labels_of(f"userCreator={user_label(u)},engineType={ENGINE},emInstance={ecm_name(e)}")
            for e in range(ECMS)
        ]
        for u in range(USERS)
    ]


async def apply_client(
    stub: Any, mode: str, rng: random.Random, w: Window, table: Any, users: int = USERS
) -> None:
    resource = resource_pb2.Resource(
        load=resource_pb2.LoadResource(memory_bytes=GiB, cpu_millis=100)
    )
    prefix = uuid.uuid4().hex[:12]
    n = 0
    while time.monotonic() < w.end:
        ecm = 0 if mode == "hot" else rng.randrange(ECMS)
        u = rng.randrange(users)
        labels = (
            table[u][ecm]
            if u < USERS
            else labels_of(
                f"userCreator={user_label(u)},engineType={ENGINE},emInstance={ecm_name(ecm)}"
            )
        )
        n += 1
        try:
            t0 = time.monotonic()
            resp = await stub.Apply(
                pb.ApplyRequest(request_id=f"{prefix}-a{n}", labels=labels, resource=resource)
            )
            t1 = time.monotonic()
            tid = resp.ticket.ticket_id
            await stub.ReportUsed(pb.ReportUsedRequest(request_id=f"{prefix}-u{n}", ticket_id=tid))
            t2 = time.monotonic()
            await stub.Release(pb.ReleaseRequest(request_id=f"{prefix}-r{n}", ticket_id=tid))
            t3 = time.monotonic()
        except grpc.aio.AioRpcError as exc:
            w.error(exc.code().name, time.monotonic())
            await asyncio.sleep(0.01)
            continue
        w.record("Apply", t0, t1)
        w.record("ReportUsed", t1, t2)
        w.record("Release", t2, t3)
        if w.inside(t3):
            w.count += 1


async def health_client(stub: Any, w: Window) -> None:
    from grpc_health.v1 import health_pb2

    request = health_pb2.HealthCheckRequest()
    while time.monotonic() < w.end:
        t0 = time.monotonic()
        try:
            await stub.Check(request)
        except grpc.aio.AioRpcError as exc:
            w.error(exc.code().name, time.monotonic())
            continue
        t1 = time.monotonic()
        w.record("Check", t0, t1)
        if w.inside(t1):
            w.count += 1


async def agent(
    stub: Any,
    agent_id: str,
    interval: float,
    rng: random.Random,
    w: Window,
    gate: asyncio.Semaphore,
    stream: bool,
) -> None:
    """One simulated agent: registers, then heartbeats paced as ecm_agent paces them
    (ecm_agent/pacing.py: every `interval` give or take a jitter), with no EngineConns,
    sent as the agent sends them (ecm_agent/beats.py: on one HeartbeatStream) or, with
    `stream` false, as unary Heartbeat calls."""
    sender = HeartbeatSender(stub, timeout=30, unary=not stream)
    async with gate:
        t0 = time.monotonic()
        await stub.RegisterEcm(register_request(agent_id), timeout=120)
        w.registered = max(w.registered, time.monotonic() - w.launched)
        w.record("RegisterEcm", t0, time.monotonic())
    sender.open()
    seq = 0
    # It beats as soon as it has registered, as a real agent does (with thousands of
    # agents registration takes longer than the ECM expiry: one that waited for the
    # others would expire); the first beat goes at a random point of the first interval,
    # and the window, after the warm-up, measures a fleet in its steady state.
    delay = rng.uniform(0, interval)
    while True:
        await asyncio.sleep(delay)
        t0 = time.monotonic()
        if t0 >= w.end:
            sender.close()
            return
        seq += 1
        try:
            resp = await sender.send(pb.HeartbeatRequest(agent_id=agent_id, sequence=seq))
        except grpc.aio.AioRpcError as exc:
            w.error(exc.code().name, time.monotonic())
            seq -= 1  # resend the same sequence number, as the agent does
            delay = 0.5
            continue
        t1 = time.monotonic()
        w.record("Heartbeat", t0, t1)
        if w.inside(t1):
            w.count += 1
        if resp.action != pb.HEARTBEAT_ACTION_CONTINUE:
            w.bump(pb.HeartbeatAction.Name(resp.action), t1)
            seq = 0
            await stub.RegisterEcm(register_request(agent_id))
        if t1 - t0 >= interval:
            w.bump("late", t1)
        delay = next_beat_delay(interval, t1 - t0, rng.random())


def register_request(agent_id: str) -> pb.RegisterEcmRequest:
    total = resource_pb2.Resource(
        load_instance=resource_pb2.LoadInstanceResource(
            memory_bytes=64 * GiB, cpu_millis=32000, instances=64
        )
    )
    return pb.RegisterEcmRequest(instance=agent_id, total_resource=total)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    w = Window(args.start_at, args.seconds)
    rng = random.Random(args.seed)
    # One channel per 16 clients: one HTTP/2 connection is itself a bottleneck.
    channels = [
        grpc.aio.insecure_channel(args.target) for _ in range(max(1, (args.clients + 15) // 16))
    ]
    try:
        if args.kind == "apply":
            table = _spread_labels()
            stubs = [resource_manager_pb2_grpc.ResourceManagerServiceStub(c) for c in channels]
            jobs = [
                apply_client(
                    stubs[i % len(stubs)],
                    args.mode,
                    random.Random(rng.random()),
                    w,
                    table,
                    args.users,
                )
                for i in range(args.clients)
            ]
        elif args.kind == "health":
            from grpc_health.v1 import health_pb2_grpc

            stubs = [health_pb2_grpc.HealthStub(c) for c in channels]
            jobs = [health_client(stubs[i % len(stubs)], w) for i in range(args.clients)]
        else:
            stubs = [resource_manager_pb2_grpc.ResourceManagerServiceStub(c) for c in channels]
            ids = [
                f"{args.agent_prefix}{i}:9000"
                for i in range(args.first_agent, args.first_agent + args.clients)
            ]
            gate = asyncio.Semaphore(32)  # registrations in flight
            jobs = [
                agent(
                    stubs[i % len(stubs)],
                    a,
                    args.interval,
                    random.Random(rng.random()),
                    w,
                    gate,
                    args.heartbeat_rpc == "stream",
                )
                for i, a in enumerate(ids)
            ]
        await asyncio.gather(*jobs)
    finally:
        for c in channels:
            await c.close()
    return w.result()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("kind", choices=["apply", "health", "heartbeat"])
    p.add_argument("--target", required=True)
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--start-at", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=["spread", "hot"], default="spread")
    p.add_argument("--users", type=int, default=USERS, help="user labels the cycles spread over")
    p.add_argument("--interval", type=float, default=3.0)
    p.add_argument("--agent-prefix", default="sim")
    p.add_argument("--first-agent", type=int, default=0)
    p.add_argument("--heartbeat-rpc", choices=["stream", "unary"], default="stream")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
