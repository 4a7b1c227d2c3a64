"""Run every benchmark, then print the issue's targets against what they measured.

    python -m bench [--database-url URL] [--quick] [--only apply_cycle heartbeats launch]

Each benchmark runs as its own command (as documented in docs/benchmarks.md) and
prints its own table and JSON line; this prints a summary table and one JSON line.
`make bench` runs this. --quick shortens every window (a smoke run, not figures).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from bench.common import ROOT, emit, table

BENCHMARKS = ("apply_cycle", "heartbeats", "launch")


def run(name: str, args: list[str]) -> dict[str, Any] | None:
    print(f"\n=== python -m bench.{name} {' '.join(args)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith('{"benchmark"'):
            result = json.loads(line)
        print(line, flush=True)
    print(f"=== bench.{name}: exit {proc.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
    return result


def _find(results: list[dict[str, Any]], mode: str, clients: int) -> dict[str, Any]:
    return next((r for r in results if r["mode"] == mode and r["clients"] == clients), {})


def targets(out: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(target: str, value: Any, met: bool | None, note: str = "") -> None:
        rows.append({"target": target, "measured": value, "met": met, "note": note})

    ac = out.get("apply_cycle")
    if ac:
        spread = _find(ac["results"], "spread", 64)
        hot = _find(ac["results"], "hot", 64)
        if spread.get("ratio") is not None:
            add(
                "spread labels, 64 clients: >= 0.7 x pgbench",
                spread["ratio"],
                spread["ratio"] >= 0.7,
                f"{spread['labelrm']['cycles_per_s']} vs {spread['pgbench']['cycles_per_s']} cycles/s",
            )
        if hot.get("ratio") is not None:
            add(
                "hot ECM label, 64 clients: >= 3 x pgbench",
                hot["ratio"],
                hot["ratio"] >= 3.0,
                f"{hot['labelrm']['cycles_per_s']} vs {hot['pgbench']['cycles_per_s']} cycles/s",
            )
        add(
            "invariants after the load (CheckConsistency)",
            ac["consistency"]["consistent"],
            ac["consistency"]["consistent"],
        )
    hb = out.get("heartbeats")
    if hb:
        # The absolute targets next to what this machine allows: how many empty calls
        # one RM core serves, how fast bare sudo + python start with 16 in flight.
        floor_us = (hb.get("floor") or {}).get("server_cpu_us_per_call")
        floor = (
            f"; gRPC floor {round(1e6 / floor_us)} empty calls per RM core-s" if floor_us else ""
        )
        for r in hb["results"]:
            if r["agents"] == 5000:
                add(
                    "5000 agents at 3 s: heartbeat p99 < 50 ms",
                    r["p99_ms"],
                    r["p99_ms"] < 50,
                    f"{r['heartbeats_per_s']}/s of {r['expected_per_s']}/s expected{floor}",
                )
                add("5000 agents at 3 s: no missed expiry (LOST)", r["lost"], r["lost"] == 0)
    la = out.get("launch")
    if la and "targets" in la:
        t = la["targets"]
        add(
            "EngineConn create->ready p50 < 250 ms",
            t["create_to_ready_p50_ms"],
            t["create_to_ready_p50_ms"] < 250,
        )
        add(
            "overhead over bare sudo + python start p50 < 100 ms",
            t["overhead_p50_ms"],
            t["overhead_p50_ms"] < 100,
        )
        bare = la.get("floor", {}).get("sudo_python", {}).get("per_s_in_flight")
        add(
            ">= 20 launches/s with 16 in flight",
            t["launches_per_s_in_flight"],
            t["launches_per_s_in_flight"] >= 20,
            f"bare sudo + python start, 16 in flight: {bare}/s" if bare else "",
        )
    elif la:
        add("EngineConn launch", "skipped", None, la.get("skipped", ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default="")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    args = parser.parse_args(argv)
    db = ["--database-url", args.database_url] if args.database_url else []
    plans = {
        "apply_cycle": db + (["--seconds", "2", "--clients", "1", "16"] if args.quick else []),
        "heartbeats": db + (["--seconds", "5", "--agents", "200"] if args.quick else []),
        "launch": db + (["--seconds", "4"] if args.quick else []),
    }
    out = {name: run(name, plans[name]) for name in args.only}
    rows = targets(out)
    text = table(
        ["target", "measured", "met", "note"],
        [
            [r["target"], r["measured"], {True: "yes", False: "NO", None: "-"}[r["met"]], r["note"]]
            for r in rows
        ],
    )
    print()
    emit("summary", "benchmark targets on this machine:\n" + text, {"targets": rows})
    return 0 if all(out.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
