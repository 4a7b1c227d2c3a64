"""What a change costs: the benchmarks of another commit and of this tree, interleaved.

    python -m bench.compare --rev REV [--rounds 2] [--only apply_cycle heartbeats]

Checks REV out into a temporary git worktree and runs `python -m bench.NAME` there and
here, before / after / before / after (`--rounds` times), so that the machine's drift
between windows falls on both sides. The other tree runs on this interpreter, with its
own packages first on PYTHONPATH (its generated protobuf code included). Prints, per
figure, every run of each side, the mean after ÷ before, and the same with each run
divided by its own empty-call rate (the gRPC floor the apply cycle measures beside it),
then one JSON line. `make bench-compare REV=...` runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import ROOT, emit, table

BENCHMARKS = ("apply_cycle", "heartbeats")


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A detached git worktree of `rev`, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="labelrm-compare-")) / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), rev],
        check=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
        )


def run(tree: Path, name: str) -> dict[str, Any] | None:
    """`python -m bench.NAME` in `tree`; its JSON line, or None if it printed none."""
    env = dict(os.environ)
    if tree != ROOT:
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{tree / 'protos'}"
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}"],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"benchmark"')]
    return json.loads(lines[-1]) if lines else None


def figures(result: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
    """(value, value per empty call of the same run or None) for each figure of a run."""
    out: dict[str, tuple[float, float | None]] = {}
    if result["benchmark"] == "apply_cycle":
        floor = result.get("floor", {})
        for r in result["results"]:
            rate = r["labelrm"]["cycles_per_s"]
            empty = (floor.get(str(r["clients"])) or {}).get("rpcs_per_s")
            key = f"{r['mode']}, {r['clients']} clients: cycles/s"
            out[key] = (rate, rate / empty if empty else None)
    elif result["benchmark"] == "heartbeats":
        for r in result["results"]:
            out[f"{r['agents']} agents: RM us per beat"] = (r["server_cpu_us_per_beat"], None)
            out[f"{r['agents']} agents: p99 ms"] = (r["p99_ms"], None)
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def compare(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A row per figure: the runs of each side and the ratios of their means."""
    sides = {side: [figures(r) for r in results] for side, results in runs.items()}
    names = sorted({name for side in sides.values() for run in side for name in run})
    rows = []
    for name in names:
        row: dict[str, Any] = {"figure": name}
        means = {}
        for side, side_runs in sides.items():
            # A window that measured nothing (0 cycles/s: its clients failed to start) is
            # left out rather than averaged in.
            got = [run[name] for run in side_runs if name in run and run[name][0]]
            row[side] = [round(v, 2) for v, _ in got]
            means[side] = (_mean([v for v, _ in got]), _mean([n for _, n in got if n]))
        (b, bn), (a, an) = means["before"], means["after"]
        row["after_over_before"] = round(a / b, 3) if a and b else None
        row["per_empty_call"] = round(an / bn, 3) if an and bn else None
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rev", required=True, help="the commit to compare this tree with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with worktree(args.rev) as before:
        for n in range(args.rounds):
            for side, tree in (("before", before), ("after", ROOT)):
                for name in args.only:
                    print(f"=== round {n + 1}: {side} bench.{name}", flush=True)
                    result = run(tree, name)
                    if result is None:
                        print(f"    bench.{name} printed no result", flush=True)
                    else:
                        runs[side].append(result)
    rows = compare(runs)

    def pct(ratio: float | None) -> str:
        return "-" if ratio is None else f"{100 * (ratio - 1):+.0f} %"

    text = table(
        ["figure", f"before ({args.rev})", "after (this tree)", "after / before", "per empty call"],
        [
            [
                r["figure"],
                r["before"],
                r["after"],
                pct(r["after_over_before"]),
                pct(r["per_empty_call"]),
            ]
            for r in rows
        ],
    )
    emit("compare", text, {"rev": args.rev, "rounds": args.rounds, "rows": rows})
    return 0 if runs["before"] and runs["after"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
