"""Peers: Ray measured on this machine, so that labelrm's figures can be set beside
Ray's from the same run (Ray is what a Python user would most likely pick instead).

    python -m bench.peers [--seconds 6] [--warmup 2]      (make bench-peers)

Ray (pinned: RAY_VERSION) is installed into its own virtualenv, build/peers-venv,
created with this interpreter (`sys.executable -m venv`) and reused while it holds the
pinned version; it never goes into the project's venv. The measurement runs there, in
a subprocess of that venv's python (the script is RAY_SCRIPT below): a local
`ray.init(num_cpus=2, include_dashboard=False)`, no usage stats, logs kept quiet. Each
workload warms up for --warmup seconds, then counts what completes in a window of
--seconds:

- placement groups, sequential: create a placement group of one bundle {"CPU": 0.001}
  (a small reservation on the node, as labelrm's Apply reserves resources on an ECM),
  wait for `pg.ready()`, `remove_placement_group`: cycles/s, p50/p99 of one cycle;
- placement groups, 16 in flight: 16 cycles outstanding, each replaced as it completes;
- actors, sequential: create an actor (num_cpus=0), call `ping` and get the answer,
  `ray.kill` it: actors/s, p50/p99 from create to the first ping's answer;
- actors, 16 in flight: the same with 16 outstanding.

CPU (cores) is given per window: `ray`, the driver and every process below it (GCS,
raylet, workers; in the actor rows the process tree is re-read every 100 ms, since an
exited worker's time is otherwise lost); `other`, whatever else kept the machine busy
meanwhile (above ~0.2, the figures are disturbed).

Prints a table and one JSON line (bench.common.emit), and writes the same payload to
build/bench-peers.json (RESULT; `load_latest()` reads it back) for `python -m bench`.
The file's keys:

    ray_version                          "2.60.0"
    placement_groups_sequential_per_s    create -> ready -> remove cycles/s, one at a time
    placement_group_p50_ms               p50 of one such cycle (ms)
    placement_group_p99_ms               p99 of one such cycle (ms)
    placement_groups_16_in_flight_per_s  cycles/s with 16 outstanding
    actors_sequential_per_s              create -> ping -> kill cycles/s, one at a time
    actor_create_to_ping_p50_ms          p50 from create to the first ping's answer (ms)
    actor_create_to_ping_p99_ms          its p99 (ms)
    actors_16_in_flight_per_s            actors/s with 16 outstanding
    commits                              {"labelrm": ..., "ray": ...}: what each side
                                         has committed when it answers
    seconds, warmup, in_flight           the settings of the run
    measured_at                          UTC, ISO 8601
    machine                              bench.common.machine()
    ray                                  the script's whole output (per workload: per_s,
                                         p50_ms, p99_ms, cycles, cpu, ...)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, emit, machine, ms, table

RAY_VERSION = "2.60.0"
IN_FLIGHT = 16
VENV = ROOT / "build" / "peers-venv"
RESULT = ROOT / "build" / "bench-peers.json"
PIP = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]

COMMITS = {
    "labelrm": "Apply answers after its PostgreSQL transaction committed (synchronous_commit"
    " on): the ticket is durable and survives an RM crash or restart",
    "ray": "a placement group lives in the GCS's memory (bundles reserved on the raylets);"
    " not durable unless GCS fault tolerance with an external Redis is configured (it is"
    " not here): a GCS crash loses it",
}

# Run by build/peers-venv's python: argv = seconds warmup in_flight; prints one JSON line.
RAY_SCRIPT = r'''
import json
import logging
import os
import sys
import threading
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group

SECONDS, WARMUP, IN_FLIGHT = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
BUNDLE = {"CPU": 0.001}
TICK = os.sysconf("SC_CLK_TCK")


def machine_busy():
    """Busy CPU seconds of the whole machine (/proc/stat)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:9]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / TICK


def ray_procs():
    """pid -> CPU seconds (user + system) of this driver and every process below it:
    GCS, raylet, workers."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    f = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(name)] = (int(f[1]), (int(f[11]) + int(f[12])) / TICK)
    children = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    ours, todo = {}, [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in stats:
            ours[pid] = stats[pid][1]
        todo += children.get(pid, [])
    return ours


class CpuWindow:
    """The CPU (cores) Ray's processes used in a window, and what else kept the machine
    busy meanwhile. The raylet ignores SIGCHLD: a worker that exits (a killed actor's)
    leaves its time in nobody's children times, so with `follow` a thread re-reads the
    process tree every 100 ms and each process counts with its last reading."""

    def __init__(self, follow):
        self.t0 = time.perf_counter()
        self.busy0 = machine_busy()
        self.first = ray_procs()
        self.last = dict(self.first)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.follow, daemon=True) if follow else None
        if self.thread is not None:
            self.thread.start()

    def follow(self):
        while not self.done.wait(0.1):
            self.last.update(ray_procs())

    def stop(self):
        """(seconds, {"ray": cores, "other": cores}) since the start."""
        if self.thread is not None:
            self.done.set()
            self.thread.join()
        self.last.update(ray_procs())
        busy = machine_busy() - self.busy0
        wall = time.perf_counter() - self.t0
        used = sum(cpu - self.first.get(pid, 0.0) for pid, cpu in self.last.items())
        other = max(0.0, busy - used)
        return wall, {"ray": round(used / wall, 2), "other": round(other / wall, 2)}


def pct(values, p):
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)


@ray.remote(num_cpus=0)
class Pinger:
    def ping(self):
        return os.getpid()


def start_pg():
    pg = placement_group([BUNDLE])
    return pg.ready(), pg


def start_actor():
    actor = Pinger.remote()
    return actor.ping.remote(), actor


def run(start, finish, depth, follow=False):
    """Keep `depth` cycles outstanding: `start()` -> (ref, handle); when the ref is
    ready, `finish(handle)` and start the next. Warm up, then measure a window
    (`follow`: processes come and go, see CpuWindow)."""
    pending = {}

    def launch():
        t = time.perf_counter()
        ref, handle = start()
        pending[ref] = (handle, t)

    for _ in range(depth):
        launch()
    ready, cycle = [], []
    window_at = time.perf_counter() + WARMUP
    end = window_at + SECONDS
    window = None
    while True:
        now = time.perf_counter()
        if window is None and now >= window_at:
            ready, cycle = [], []
            window = CpuWindow(follow)
        if now >= end:
            break
        timeout = (end if window is not None else window_at) - now
        done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        for ref in done:
            handle, t = pending.pop(ref)
            ray.get(ref)
            ready.append(time.perf_counter() - t)
            finish(handle)
            cycle.append(time.perf_counter() - t)
            launch()
    wall, cpu = window.stop()
    for handle, _ in pending.values():
        finish(handle)
    time.sleep(1.0)  # let the clean-up of what was outstanding settle before the next
    return {
        "per_s": round(len(cycle) / wall, 1),
        "cycles": len(cycle),
        "window_s": round(wall, 2),
        "ready_p50_ms": pct(ready, 0.5),
        "ready_p99_ms": pct(ready, 0.99),
        "cycle_p50_ms": pct(cycle, 0.5),
        "cycle_p99_ms": pct(cycle, 0.99),
        "cpu": cpu,
    }


os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
t = time.perf_counter()
ray.init(
    num_cpus=2,
    include_dashboard=False,
    log_to_driver=False,
    logging_level=logging.ERROR,
    object_store_memory=128 * 1024**2,
)
init_s = time.perf_counter() - t
out = {
    "ray_version": ray.__version__,
    "python": sys.version.split()[0],
    "init_s": round(init_s, 2),
    "bundle": BUNDLE,
    "placement_groups": {
        "sequential": run(start_pg, remove_placement_group, 1),
        "in_flight": run(start_pg, remove_placement_group, IN_FLIGHT),
    },
    "actors": {
        "sequential": run(start_actor, ray.kill, 1, follow=True),
        "in_flight": run(start_actor, ray.kill, IN_FLIGHT, follow=True),
    },
}
ray.shutdown()
print(json.dumps(out), flush=True)
'''


def venv_python() -> Path:
    """The python of the peers' virtualenv (build/peers-venv)."""
    return VENV / "bin" / "python"


def installed_version(python: Path) -> str | None:
    """The Ray version `python` imports, None without a working python or Ray."""
    try:
        probe = subprocess.run(
            [str(python), "-c", "import ray; print(ray.__version__)"],
            capture_output=True,
            text=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        )
    except OSError:  # no such python
        return None
    return (probe.stdout.strip() or None) if probe.returncode == 0 else None


def _runs(python: Path) -> bool:
    """Whether `python` exists and starts."""
    try:
        return subprocess.run([str(python), "-c", "pass"]).returncode == 0
    except OSError:
        return False


def ensure_ray() -> Path:
    """build/peers-venv with Ray RAY_VERSION: reused when it has it, else created
    (with this interpreter) and Ray pip-installed. Exits naming the failed step."""
    python = venv_python()
    if installed_version(python) == RAY_VERSION:
        return python
    rel = VENV.relative_to(ROOT)
    if not _runs(python):
        print(f"peers: creating {rel} with {sys.executable}", file=sys.stderr, flush=True)
        rc = subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)]).returncode
        if rc != 0:
            raise SystemExit(
                f"bench.peers: step `{sys.executable} -m venv {rel}` failed (exit {rc})"
            )
    print(f"peers: pip install ray=={RAY_VERSION} into {rel}", file=sys.stderr, flush=True)
    rc = subprocess.run([str(python), *PIP, f"ray=={RAY_VERSION}"]).returncode
    if rc != 0:
        raise SystemExit(
            f"bench.peers: step `pip install ray=={RAY_VERSION}` into {rel} failed (exit {rc})"
        )
    found = installed_version(python)
    if found != RAY_VERSION:
        raise SystemExit(
            f"bench.peers: step `import ray` in {rel} failed: found {found!r}, want {RAY_VERSION}"
        )
    return python


def run_ray(python: Path, seconds: float, warmup: float) -> dict[str, Any]:
    """Run RAY_SCRIPT under `python` (its own session, Ray's files in a temporary
    directory removed afterwards) and return the JSON object it printed."""
    tmp = Path(tempfile.mkdtemp(prefix="labelrm-peers-"))
    script = tmp / "ray_peers.py"
    script.write_text(RAY_SCRIPT)
    err = tmp / "stderr.log"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(tmp)}
    env.pop("PYTHONPATH", None)
    timeout = 4 * (warmup + seconds + 1) + 240
    try:
        with err.open("wb") as fh:
            proc = subprocess.Popen(
                [str(python), str(script), repr(seconds), repr(warmup), str(IN_FLIGHT)],
                stdout=subprocess.PIPE,
                stderr=fh,
                env=env,
                cwd=tmp,
                start_new_session=True,
            )
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise SystemExit(
                    f"bench.peers: step `run the Ray script` timed out after {timeout:.0f}s"
                ) from None
        lines = [x for x in out.decode().splitlines() if x.startswith("{")]
        if proc.returncode != 0 or not lines:
            sys.stderr.write(err.read_text(errors="replace")[-3000:])
            raise SystemExit(
                f"bench.peers: step `run the Ray script` failed (exit {proc.returncode})"
            )
        result: dict[str, Any] = json.loads(lines[-1])
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summary(raw: dict[str, Any], seconds: float, warmup: float) -> dict[str, Any]:
    """The payload: the flat keys of the module docstring, then the details."""
    pgs, actors = raw["placement_groups"], raw["actors"]
    return {
        "ray_version": raw["ray_version"],
        "placement_groups_sequential_per_s": pgs["sequential"]["per_s"],
        "placement_group_p50_ms": pgs["sequential"]["cycle_p50_ms"],
        "placement_group_p99_ms": pgs["sequential"]["cycle_p99_ms"],
        "placement_groups_16_in_flight_per_s": pgs["in_flight"]["per_s"],
        "actors_sequential_per_s": actors["sequential"]["per_s"],
        "actor_create_to_ping_p50_ms": actors["sequential"]["ready_p50_ms"],
        "actor_create_to_ping_p99_ms": actors["sequential"]["ready_p99_ms"],
        "actors_16_in_flight_per_s": actors["in_flight"]["per_s"],
        "commits": COMMITS,
        "seconds": seconds,
        "warmup": warmup,
        "in_flight": IN_FLIGHT,
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "ray": raw,
    }


def report(raw: dict[str, Any], seconds: float, warmup: float) -> str:
    """The table of the run."""

    def ms_or_dash(value: float | None) -> str:
        return ms(float("nan") if value is None else value)

    rows = []
    for name, key, latency in (
        ("placement group: create, ready(), remove", "placement_groups", "cycle"),
        ("actor: create, ping, kill", "actors", "ready"),
    ):
        for depth, part in ((1, "sequential"), (IN_FLIGHT, "in_flight")):
            r = raw[key][part]
            rows.append(
                [
                    name,
                    depth,
                    r["per_s"],
                    f"{ms_or_dash(r[f'{latency}_p50_ms'])}/{ms_or_dash(r[f'{latency}_p99_ms'])}",
                    f"{r['cpu']['ray']}/{r['cpu']['other']}",
                ]
            )
    return "\n".join(
        [
            f"peers: Ray {raw['ray_version']} in {VENV.relative_to(ROOT)} (Python {raw['python']}),"
            f" local ray.init(num_cpus=2) in {raw['init_s']}s; bundle {json.dumps(raw['bundle'])}",
            f"each row measured {seconds:g}s after {warmup:g}s warm-up; latencies in ms (placement"
            " group: the whole cycle; actor: create -> first ping answered); CPU in cores",
            table(["workload", "in flight", "per s", "p50/p99 ms", "CPU ray/other"], rows),
            "",
            "what each side has committed when it answers:",
            f"  labelrm: {COMMITS['labelrm']}",
            f"  Ray:     {COMMITS['ray']}",
            "labelrm's side of the comparison: python -m bench.apply_cycle (Apply -> ReportUsed"
            " -> Release) and python -m bench.launch (CreateEngineConn -> ready)",
            f"written to {RESULT.relative_to(ROOT)}",
        ]
    )


def load_latest() -> dict[str, Any] | None:
    """The payload of the latest run (build/bench-peers.json), None when there is none."""
    try:
        data: dict[str, Any] = json.loads(RESULT.read_text())
    except (OSError, ValueError):
        return None
    return data


def main(argv: list[str] | None = None) -> int:
    """Install (or reuse) Ray in build/peers-venv, measure, print, write RESULT."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="measured window per row")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up before each window")
    args = parser.parse_args(argv)

    python = ensure_ray()
    print(
        f"peers: measuring Ray (~{4 * (args.warmup + args.seconds + 1) + 10:.0f}s)",
        file=sys.stderr,
        flush=True,
    )
    raw = run_ray(python, args.seconds, args.warmup)
    payload = summary(raw, args.seconds, args.warmup)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    partial = RESULT.with_suffix(".json.tmp")
    partial.write_text(json.dumps({**payload, "machine": machine()}, indent=2) + "\n")
    partial.replace(RESULT)
    emit("peers", report(raw, args.seconds, args.warmup), payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
