"""What one TAB costs: `rmctl __complete` against the interpreter's own start.

    python -m bench.completion [--runs N]

Shell completion starts rmctl on every TAB. Measured, interleaved so that the machine's
load hits each alike: the bare interpreter (`python -c pass`, the floor: nothing a
command can do costs less), a TAB completing a subcommand from the cached command tree
(no grpc), and `rmctl --version` (the whole CLI loaded: grpc, protobuf, every parser),
which is what each TAB cost before. The figure is the median TAB over the median floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import ROOT, emit, table

TAB = [sys.executable, "-m", "rmctl", "__complete", "2", "rmctl", "node", "c"]
CASES = {
    "interpreter (python -c pass)": [sys.executable, "-c", "pass"],
    "TAB: rmctl node c<TAB>": TAB,
    "whole CLI (rmctl --version)": [sys.executable, "-m", "rmctl", "--version"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        # The tree, cached once (as after the first TAB).
        subprocess.run(TAB, env=env, cwd=ROOT, check=True, capture_output=True)
        times: dict[str, list[float]] = {name: [] for name in CASES}
        for _ in range(args.runs):
            for name, command in CASES.items():
                t0 = time.perf_counter()
                subprocess.run(command, env=env, cwd=ROOT, check=True, capture_output=True)
                times[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(values) for name, values in times.items()}
    floor = median["interpreter (python -c pass)"]
    rows = [(name, f"{m * 1000:.0f} ms", f"{m / floor:.2f}") for name, m in median.items()]
    text = table(("command", "median", "x interpreter"), rows)
    emit("completion", text, {
        "runs": args.runs,
        "median_s": median,
        "tab_over_interpreter": median["TAB: rmctl node c<TAB>"] / floor,
        "whole_cli_over_interpreter": median["whole CLI (rmctl --version)"] / floor,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
