"""Apply -> ReportUsed -> Release cycles through the real gRPC server.

    python -m bench.apply_cycle [--clients 16] [--seconds 10] [--mode spread|hot|both]
                                [--database-url URL]

Starts its own rm-server (embedded PostgreSQL in a temporary directory unless a URL
is given), seeds 16 ECMs and a wildcard limit, and runs N concurrent clients:
- spread: each request names one of 1000 userCreator+engineType labels (each with
  a limit record) and one of the 16 ECMs;
- hot: every request names the same ECM label.
Prints a table and one JSON line. The pgbench ceiling comparison lands with the
benchmarks issue.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2_grpc, resource_pb2
from labelrm.v1 import resource_manager_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
GiB = 1024**3


def _labels(text: str) -> list[resource_pb2.Label]:
    return [
        resource_pb2.Label(key=k, value=v)
        for k, _, v in (p.partition("=") for p in text.split(","))
    ]


def _load(mem: int, cpu: int) -> resource_pb2.Resource:
    return resource_pb2.Resource(load=resource_pb2.LoadResource(memory_bytes=mem, cpu_millis=cpu))


def _start_server(database_url: str, tmp: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "rm_server",
        "--listen",
        f"127.0.0.1:{port}",
        "--log-level",
        "WARNING",
    ]
    cmd += ["--database-url", database_url] if database_url else ["--data-dir", str(tmp)]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 60
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return proc
            except grpc.RpcError:
                time.sleep(0.1)
    proc.kill()
    raise SystemExit("rm-server did not start")


async def _seed(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as ch:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        for i in range(16):
            total = resource_pb2.Resource(
                load_instance=resource_pb2.LoadInstanceResource(
                    memory_bytes=1 << 50, cpu_millis=1 << 40, instances=1 << 30
                )
            )
            await rm.RegisterEcm(
                pb.RegisterEcmRequest(instance=f"bench{i}:9000", total_resource=total)
            )
        await admin.SetLabelLimit(
            admin_pb2.SetLabelLimitRequest(
                labels=_labels("userCreator=*,engineType=*"), max_resource=_load(1 << 50, 1 << 40)
            )
        )


async def _client(
    stub, mode: str, seed: int, stop_at: float, lat: dict[str, list[float]], counts: dict[str, int]
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop_at:
        if mode == "hot":
            labels = f"userCreator=u{rng.randrange(1000)}-IDE,engineType=spark-3.2.1,emInstance=bench0:9000"
        else:
            labels = (
                f"userCreator=u{rng.randrange(1000)}-IDE,engineType=spark-3.2.1,"
                f"emInstance=bench{rng.randrange(16)}:9000"
            )
        t0 = time.perf_counter()
        ticket = (
            await stub.Apply(pb.ApplyRequest(labels=_labels(labels), resource=_load(GiB, 100)))
        ).ticket
        t1 = time.perf_counter()
        await stub.ReportUsed(pb.ReportUsedRequest(ticket_id=ticket.ticket_id))
        t2 = time.perf_counter()
        await stub.Release(pb.ReleaseRequest(ticket_id=ticket.ticket_id))
        t3 = time.perf_counter()
        lat["Apply"].append(t1 - t0)
        lat["ReportUsed"].append(t2 - t1)
        lat["Release"].append(t3 - t2)
        counts["cycles"] += 1


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


async def _run(target: str, mode: str, clients: int, seconds: float) -> dict[str, object]:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        # Warm-up: creates the limit rows so the measured run is steady state.
        await asyncio.gather(
            *(
                _client(
                    stub,
                    mode,
                    i,
                    time.monotonic() + 2,
                    {"Apply": [], "ReportUsed": [], "Release": []},
                    {"cycles": 0},
                )
                for i in range(clients)
            )
        )
        lat: dict[str, list[float]] = {"Apply": [], "ReportUsed": [], "Release": []}
        counts = {"cycles": 0}
        start = time.monotonic()
        await asyncio.gather(
            *(_client(stub, mode, 100 + i, start + seconds, lat, counts) for i in range(clients))
        )
        elapsed = time.monotonic() - start
    return {
        "mode": mode,
        "clients": clients,
        "seconds": round(elapsed, 2),
        "cycles_per_s": round(counts["cycles"] / elapsed, 1),
        **{f"{rpc}_p50_ms": round(_pct(v, 0.5), 2) for rpc, v in lat.items()},
        **{f"{rpc}_p99_ms": round(_pct(v, 0.99), 2) for rpc, v in lat.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[16])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--mode", choices=["spread", "hot", "both"], default="both")
    parser.add_argument("--database-url", default="")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="labelrm-bench-"))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _start_server(args.database_url, tmp, port)
    target = f"127.0.0.1:{port}"
    results = []
    try:
        asyncio.run(_seed(target))
        modes = ["spread", "hot"] if args.mode == "both" else [args.mode]
        for mode in modes:
            for clients in args.clients:
                results.append(asyncio.run(_run(target, mode, clients, args.seconds)))
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{'mode':<8}{'clients':>8}{'cycles/s':>10}{'Apply p50/p99 ms':>20}{'Report p50/p99':>18}{'Release p50/p99':>18}"
    )
    for r in results:
        print(
            f"{r['mode']:<8}{r['clients']:>8}{r['cycles_per_s']:>10}"
            f"{r['Apply_p50_ms']:>11}/{r['Apply_p99_ms']:<8}{r['ReportUsed_p50_ms']:>9}/{r['ReportUsed_p99_ms']:<8}"
            f"{r['Release_p50_ms']:>9}/{r['Release_p99_ms']:<8}"
        )
    print(json.dumps({"benchmark": "apply_cycle", "results": results}))
    _ = statistics  # imported for future use in the benchmarks issue
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
