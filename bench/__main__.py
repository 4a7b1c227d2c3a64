"""Run every benchmark, then print each target against what it measured: met or NOT MET.

    python -m bench [--database-url URL] [--quick] [--only peers apply_cycle heartbeats launch]

Each benchmark runs as its own command (as documented in docs/benchmarks.md) and
prints its own table and JSON line; this prints a summary table and one JSON line.
`make bench` runs this. The targets are ratios against a ceiling measured in the same
run: pgbench running the store's SQL, the empty gRPC call, bare sudo + python start,
and Ray (bench.peers, in its own virtualenv). --quick shortens every window (a smoke
run, not figures).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from bench.common import ROOT, emit, table
from bench.heartbeats import cpu_per_call_us

BENCHMARKS = ("peers", "apply_cycle", "heartbeats", "launch")


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


class Targets:
    """The targets' rows: what was measured against what it must reach, met or not (None:
    not measured in this run, with the reason in the note)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def ratio(
        self, target: str, value: float | None, bound: float, note: str, most: bool = False
    ) -> None:
        """A ratio that must be at least `bound` (at most, with `most`)."""
        met = None if value is None else (value <= bound if most else value >= bound)
        self.add(target, value if value is not None else "-", met, note)

    def add(self, target: str, value: Any, met: bool | None, note: str = "") -> None:
        self.rows.append({"target": target, "measured": value, "met": met, "note": note})


def _apply_targets(t: Targets, ac: dict[str, Any], ray: dict[str, Any] | None) -> None:
    results, floor = ac["results"], ac.get("floor", {})
    one = _find(results, "spread", 1)
    if one.get("pgbench"):
        rate, base = one["labelrm"]["cycles_per_s"], one["pgbench"]["cycles_per_s"]
        t.ratio(
            "1 client: cycles/s >= 0.9 x pgbench's same SQL, 1 client",
            one.get("ratio"),
            0.9,
            f"{rate} vs {base} cycles/s",
        )
    empty = floor.get("1") or floor.get(1)
    if one and empty:
        rpc = cpu_per_call_us(
            one["labelrm"]["cpu"].get("server", 0.0), one["labelrm"]["cycles_per_s"] * 3
        )
        call = cpu_per_call_us(empty["cpu"].get("server", 0.0), empty["rpcs_per_s"])
        t.ratio(
            "1 client: RM CPU per RPC <= 1.5 x the empty call's",
            round(rpc / call, 2) if rpc and call else None,
            1.5,
            f"{rpc} vs {call} us of RM CPU per call",
            most=True,
        )
    sixteen = _find(results, "spread", 16)
    ray_rate = (ray or {}).get("placement_groups_16_in_flight_per_s")
    if sixteen:
        rate = sixteen["labelrm"]["cycles_per_s"]
        t.ratio(
            "16 clients: cycles/s >= 1.5 x Ray's placement groups, 16 in flight",
            round(rate / ray_rate, 2) if ray_rate else None,
            1.5,
            f"{rate} vs {ray_rate} per s" if ray_rate else "Ray not measured (make bench-peers)",
        )
    for mode, bound in (("spread", 2.0), ("hot", 5.0)):
        row = _find(results, mode, 64)
        if row.get("pgbench"):
            t.ratio(
                f"64 clients, {mode}: cycles/s >= {bound:g} x pgbench",
                row.get("ratio"),
                bound,
                f"{row['labelrm']['cycles_per_s']} vs {row['pgbench']['cycles_per_s']} cycles/s",
            )
    check = ac["consistency"]
    t.add("invariants after the load (CheckConsistency)", check["consistent"], check["consistent"])


def _heartbeat_targets(t: Targets, hb: dict[str, Any]) -> None:
    floor_us = (hb.get("floor") or {}).get("server_cpu_us_per_call")
    for r in hb["results"]:
        if r["agents"] != 5000:
            continue
        cost = (
            f"; a beat costs {r['server_cpu_us_per_beat']} us of RM CPU = "
            f"{r.get('beat_in_empty_rpcs')} empty calls ({floor_us} us)"
            if floor_us
            else ""
        )
        t.add(
            "5000 agents at 3 s: heartbeat p99 < 50 ms",
            r["p99_ms"],
            r["p99_ms"] < 50,
            f"{r['heartbeats_per_s']}/s of {r['expected_per_s']}/s expected{cost}",
        )
        t.add("5000 agents at 3 s: no missed expiry (LOST)", r["lost"], r["lost"] == 0)


def _launch_targets(t: Targets, la: dict[str, Any]) -> None:
    if "targets" not in la:
        t.add("EngineConn launch", "skipped", None, la.get("skipped", ""))
        return
    got, base = la["targets"], la.get("floor", {})
    bare_rate = base.get("sudo_python", {}).get("per_s_in_flight")
    rate = got["launches_per_s_in_flight"]
    t.ratio(
        "launches with 16 in flight >= 0.5 x bare sudo + python start",
        round(rate / bare_rate, 2) if bare_rate else None,
        0.5,
        f"{rate} vs {bare_rate} per s",
    )
    t.add(
        "create->ready p50 <= bare sudo + python start + 30 ms",
        got["overhead_p50_ms"],
        got["overhead_p50_ms"] <= 30,
        f"create->ready p50 {got['create_to_ready_p50_ms']} ms, {got['overhead_p50_ms']} ms over bare",
    )


def targets(out: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Every target of docs/benchmarks.md against what this run measured."""
    t = Targets()
    ac, hb, la = out.get("apply_cycle"), out.get("heartbeats"), out.get("launch")
    if ac:
        _apply_targets(t, ac, out.get("peers"))
    if hb:
        _heartbeat_targets(t, hb)
    if la:
        _launch_targets(t, la)
    ray = out.get("peers")
    if ray:
        t.add(
            "Ray, same machine (for reading): placement groups 1 / 16 in flight, actors",
            f"{ray.get('placement_groups_sequential_per_s')} / "
            f"{ray.get('placement_groups_16_in_flight_per_s')} /s",
            None,
            f"actors {ray.get('actors_sequential_per_s')}/s sequential, "
            f"{ray.get('actors_16_in_flight_per_s')}/s 16 in flight; Ray {ray.get('ray_version')}",
        )
    return t.rows


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
        "peers": ["--seconds", "2"] if args.quick else [],
    }
    out = {name: run(name, plans[name]) for name in args.only}
    rows = targets(out)
    text = table(
        ["target", "measured", "met", "note"],
        [
            [
                r["target"],
                r["measured"],
                {True: "met", False: "NOT MET", None: "-"}[r["met"]],
                r["note"],
            ]
            for r in rows
        ],
    )
    print()
    emit("summary", "benchmark targets on this machine:\n" + text, {"targets": rows})
    return 0 if all(out.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
