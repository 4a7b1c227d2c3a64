"""EngineConn launch: CreateEngineConn -> ready, against bare sudo and bare Python start.

    python -m bench.launch [--seconds 20] [--in-flight 16] [--user lrmtest_a]
                           [--python /opt/labelrm/ec-venv/bin/python] [--no-install]
                           [--database-url URL]

Needs root and the test users (scripts/create_test_users.sh), like the agent tests:
the agent runs as root and starts every EngineConn through `sudo -n -u USER`. The
EngineConn runtime is (re)installed for the users with scripts/install_ec_runtime.sh
unless --no-install.

Measures, on this machine:
- the floor: `sudo -n -u USER bash -c true` and a bare `PYTHON -m engineconn --version`
  (sequential: latency; 16 at a time: rate), and both in one (`sudo ... PYTHON -m
  engineconn --version`, what a launch cannot avoid);
- labelrm: an rm-server and a real ecm-agent (subprocesses, product defaults, so with
  its fork servers: a user's launches after the first are forks of a warm interpreter);
  `--in-flight` clients loop CreateEngineConn (engineType shell-1) -> ready, then kill
  it in the background. Create->ready p50/p99 and launches/s over the window;
- the CPU each launch costs, whole (create, start, ready, kill, exit, clean-up), which
  contention from other work on the machine barely moves, unlike the rates: the RM's
  and the agent's (per process), and everything the agent started (sudo, bash, fork
  servers, EngineConns; a cgroup the agent is moved into, when one can be made, with the
  agent's own EngineConn cgroups made under it), per launch. The agent runs contained, as
  by default: each launch pays for its cgroup. `LABELRM_AGENT_FORK_SERVERS=0` in the environment measures without fork servers.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import ROOT, CpuMeter, emit, ms, pct, stack, table

DEFAULT_PYTHON = "/opt/labelrm/ec-venv/bin/python"


def preconditions(user: str, python: str, install: bool) -> str | None:
    """Why this benchmark cannot run here (None: it can)."""
    import pwd

    if os.geteuid() != 0:
        return "needs root: the agent runs as root and launches EngineConns through sudo"
    try:
        pwd.getpwnam(user)
    except KeyError:
        return f"user {user} missing: run scripts/create_test_users.sh as root"
    if subprocess.run(["sudo", "-n", "-u", user, "true"], capture_output=True).returncode != 0:
        return f"`sudo -n -u {user} true` fails: run scripts/create_test_users.sh as root"
    if install:
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "install_ec_runtime.sh")],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return f"scripts/install_ec_runtime.sh failed: {done.stderr[-1500:]}"
    if not Path(python).exists():
        return f"{python} missing: run scripts/install_ec_runtime.sh as root"
    return None


def time_command(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        out.append(time.perf_counter() - t0)
    return out


def rate_command(cmd: list[str], in_flight: int, seconds: float) -> float:
    """Completions per second with `in_flight` copies running at any time."""
    done = 0
    end = time.monotonic() + seconds
    running = [
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(in_flight)
    ]
    start = time.monotonic()
    while running:
        still = []
        for p in running:
            if p.poll() is None:
                still.append(p)
                continue
            done += 1
            if time.monotonic() < end:
                still.append(
                    subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
        running = still
        time.sleep(0.002)
    return done / (time.monotonic() - start)


def floor(user: str, python: str, in_flight: int) -> dict[str, Any]:
    cmds = {
        "sudo": ["sudo", "-n", "-u", user, "bash", "-c", "true"],
        "python": [python, "-m", "engineconn", "--version"],
        "sudo_python": ["sudo", "-n", "-u", user, python, "-m", "engineconn", "--version"],
    }
    out: dict[str, Any] = {}
    for name, cmd in cmds.items():
        time_command(cmd, 3)  # warm caches
        lat = time_command(cmd, 30)
        out[name] = {
            "p50_ms": round(pct(lat, 0.5), 1),
            "p99_ms": round(pct(lat, 0.99), 1),
            "per_s_in_flight": round(rate_command(cmd, in_flight, 4.0), 1),
        }
    return out


class TreeCpu:
    """CPU time of a process and everything it starts (sudo, the EngineConns), through
    a cpuacct cgroup (v1) or a cgroup of its own (v2): exact whatever else runs on the
    machine, where per-process sampling misses processes that exit within the window.
    `None` figures where no cgroup can be made (not root, no cgroup file system)."""

    def __init__(self, name: str) -> None:
        self.path: Path | None = None
        self.v2 = False
        for base, v2 in ((Path("/sys/fs/cgroup/cpuacct"), False), (Path("/sys/fs/cgroup"), True)):
            if v2 and not (base / "cgroup.controllers").exists():
                continue
            if not v2 and not (base / "cpuacct.usage").exists():
                continue
            try:
                (base / name).mkdir()
            except OSError:
                continue
            self.path, self.v2 = base / name, v2
            break

    def add(self, pid: int) -> bool:
        """Moves `pid` in (before it starts anything: children follow their parent)."""
        if self.path is None:
            return False
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError:
            return False
        return True

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        try:
            if self.v2:
                for line in (self.path / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
                return None
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        """Removes the cgroup once its processes are gone (waits up to 10 s for them)."""
        if self.path is None:
            return
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        print(f"bench.launch: could not remove {self.path} (processes left in it)", file=sys.stderr)


def start_agent(
    target: str, user: str, python: str, root: Path, cgroup_parent: str
) -> subprocess.Popen[bytes]:
    (root / "work").mkdir(mode=0o755, parents=True)
    cmd = [sys.executable, "-m", "ecm_agent", "--rm", target, "--agent-id", "bench-agent"]
    cmd += ["--cgroup-parent", cgroup_parent]
    cmd += [
        "--work-root",
        str(root / "work"),
        "--state-dir",
        str(root / "state"),
        "--allowed-users",
        user,
    ]
    cmd += [
        "--python",
        python,
        "--total-memory-bytes",
        str(1 << 40),
        "--total-cpu-millis",
        "1000000",
    ]
    cmd += ["--total-instances", "10000", "--log-level", "WARNING"]
    log = (root / "agent.log").open("ab")
    env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)


def remove_agent_cgroups(parent: str, tree: TreeCpu | None = None) -> None:
    """After the agent: its cgroups (what its EngineConns left in them ended); with
    `tree` (an absolute `parent` under it), the directories above them made for it in
    each hierarchy but the tree's own."""
    from ecm_agent.cgroups import NoContainment
    from ecm_agent.containment import Containment, detect_layout

    try:
        layout = detect_layout(Path("/sys/fs/cgroup"), parent)
    except NoContainment:
        return
    asyncio.run(Containment(layout, 0).teardown())
    if tree is None:
        return
    for h in layout.hierarchies:
        if h.parent.parent != tree.path:
            with contextlib.suppress(OSError):
                h.parent.parent.rmdir()


def _cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


async def wait_registered(rm: Any, instance: str, within: float = 60.0) -> None:
    """Until the agent `instance` has registered and heartbeated (SystemExit after
    `within` seconds); `rm` is a ResourceManagerServiceStub on an aio channel."""
    import grpc
    from labelrm.v1 import resource_manager_pb2 as rm_pb

    deadline = time.monotonic() + within
    while True:
        try:
            ecm = (await rm.GetEcm(rm_pb.GetEcmRequest(instance=instance))).ecm
            if ecm.state == rm_pb.ECM_STATE_RUNNING and ecm.HasField("last_heartbeat_time"):
                return
        except grpc.aio.AioRpcError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the agent did not register within {within:g} s")
        await asyncio.sleep(0.2)


class EngineConns:
    """Create and kill shell EngineConns for `user` through the RM (the calls both the
    launch benchmark and the agent-memory part make)."""

    def __init__(self, channel: Any, user: str) -> None:
        from labelrm.v1 import engine_conn_pb2 as ec_pb
        from labelrm.v1 import engine_conn_pb2_grpc, resource_pb2

        self.pb = ec_pb
        self.stub = engine_conn_pb2_grpc.EngineConnServiceStub(channel)
        self.user = user
        self.labels = [
            resource_pb2.Label(key="userCreator", value=f"{user}-IDE"),
            resource_pb2.Label(key="engineType", value="shell-1"),
        ]
        self.live_states = {
            ec_pb.ENGINE_CONN_STATE_STARTING,
            ec_pb.ENGINE_CONN_STATE_IDLE,
            ec_pb.ENGINE_CONN_STATE_BUSY,
            ec_pb.ENGINE_CONN_STATE_SHUTTING_DOWN,
        }

    async def create(self) -> Any:
        """A new EngineConn, once ready (the RM answers when it is)."""
        from google.protobuf.duration_pb2 import Duration

        request = self.pb.CreateEngineConnRequest(
            request_id=uuid.uuid4().hex,
            user=self.user,
            labels=self.labels,
            timeout=Duration(seconds=60),
        )
        return (await self.stub.CreateEngineConn(request, timeout=90)).engine_conn

    async def kill(self, engine_conn_id: str) -> None:
        request = self.pb.KillEngineConnRequest(engine_conn_id=engine_conn_id, reason="bench")
        await self.stub.KillEngineConn(request, timeout=60)

    async def drained(self, within: float, settle: float) -> None:
        """Until none of the user's EngineConns is live (at most `within` s), then `settle`
        s more: a few heartbeats, for the clean-ups to reach the agent."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if not await self._any_live():
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(settle)

    async def _any_live(self) -> bool:
        for state in self.live_states:
            request = self.pb.ListEngineConnsRequest(page_size=1, state=state)
            if (await self.stub.ListEngineConns(request)).engine_conns:
                return True
        return False


async def launches(
    target: str,
    user: str,
    plan: list[tuple[int, float]],
    pids: dict[str, list[int]],
    tree: TreeCpu | None = None,
    postgres_pids: Any = None,
) -> list[dict[str, Any]]:
    """For each (in_flight, seconds) of `plan`: that many clients creating EngineConns.

    Besides latency and rate, the CPU each launch costs: from the first create of the
    phase until every EngineConn it started has exited and been cleaned up, the CPU of
    the RM, of the agent and (`tree`) of the agent with everything it started (sudo,
    bash, the EngineConns), divided by the launches of the phase."""
    import grpc
    from labelrm.v1 import resource_manager_pb2_grpc

    async with grpc.aio.insecure_channel(target) as ch:
        ecs = EngineConns(ch, user)
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        await wait_registered(rm, "bench-agent")

        kills: set[asyncio.Task[Any]] = set()
        results = []
        warm = False
        for in_flight, seconds in plan:
            latencies: list[float] = []
            errors: dict[str, int] = {}
            counted = 0
            created = 0  # every launch of the phase, for the CPU per launch
            state = {"start": 0.0, "end": 0.0}

            async def kill(ec_id: str, errors: dict[str, int] = errors) -> None:
                try:
                    await ecs.kill(ec_id)
                except grpc.aio.AioRpcError as exc:
                    errors["kill " + exc.code().name] = errors.get("kill " + exc.code().name, 0) + 1

            async def client(
                stop_at: float,
                measure: bool,
                latencies: list[float] = latencies,
                errors: dict[str, int] = errors,
                state: dict[str, float] = state,
                kill: Any = kill,
            ) -> None:
                nonlocal counted, created
                while time.monotonic() < stop_at:
                    t0 = time.monotonic()
                    try:
                        ec = await ecs.create()
                    except grpc.aio.AioRpcError as exc:
                        errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                        await asyncio.sleep(0.1)
                        continue
                    t1 = time.monotonic()
                    created += measure
                    if measure and state["start"] <= t0 and t1 < state["end"]:
                        latencies.append(t1 - t0)
                    if measure and state["start"] <= t1 < state["end"]:
                        counted += 1
                    task = asyncio.create_task(kill(ec.engine_conn_id))
                    kills.add(task)
                    task.add_done_callback(kills.discard)

            if not warm:  # a few launches first, so that every cache is warm
                await asyncio.gather(*(client(time.monotonic() + 3, False) for _ in range(4)))
                await asyncio.gather(*list(kills), return_exceptions=True)
                warm = True
            await ecs.drained(30, 0.5)  # the previous phase's EngineConns are gone
            state["start"] = time.monotonic() + 0.3
            state["end"] = state["start"] + seconds
            if postgres_pids is not None:  # the RM's pool has grown by now: its backends
                pids["postgres"] = postgres_pids()
            meter = CpuMeter({"server": pids["server"], "agent": pids["agent"]})
            meter.start()
            rm0, agent0 = _cpu_seconds(pids["server"]), _cpu_seconds(pids["agent"])
            pg0 = _cpu_seconds(pids.get("postgres", []))
            tree0 = tree.seconds() if tree is not None else None
            await asyncio.gather(*(client(state["end"], True) for _ in range(in_flight)))
            cpu = meter.stop()
            await asyncio.gather(*list(kills), return_exceptions=True)
            await ecs.drained(30, 0.5)
            rm_s = _cpu_seconds(pids["server"]) - rm0
            agent_s = _cpu_seconds(pids["agent"]) - agent0
            pg_s = _cpu_seconds(pids.get("postgres", [])) - pg0
            tree1 = tree.seconds() if tree is not None else None
            per = max(created, 1) / 1000  # seconds -> ms per launch
            per_launch: dict[str, float | None] = {
                "rm_ms": round(rm_s / per, 1),
                "agent_ms": round(agent_s / per, 1),
                "engineconns_ms": None,
                "total_ms": None,
                "postgres_ms": round(pg_s / per, 1),
            }
            if tree0 is not None and tree1 is not None:
                # The cgroup holds the agent and everything it started.
                per_launch["engineconns_ms"] = round((tree1 - tree0 - agent_s) / per, 1)
                per_launch["total_ms"] = round((rm_s + tree1 - tree0) / per, 1)
            results.append(
                {
                    "in_flight": in_flight,
                    "launches_per_s": round(counted / seconds, 1),
                    "p50_ms": round(pct(latencies, 0.5), 1),
                    "p99_ms": round(pct(latencies, 0.99), 1),
                    "launches": counted,
                    "errors": errors,
                    "cpu": cpu,
                    "cpu_per_launch": per_launch,
                    "launches_metered": created,
                }
            )
        # Leave nothing running.
        await ecs.drained(30, 0.5)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--user", default="lrmtest_a")
    parser.add_argument(
        "--python",
        default=os.environ.get("LABELRM_EC_VENV", "/opt/labelrm/ec-venv") + "/bin/python",
    )
    parser.add_argument(
        "--no-install", action="store_true", help="do not run scripts/install_ec_runtime.sh"
    )
    parser.add_argument("--database-url", default="")
    args = parser.parse_args(argv)

    why = preconditions(args.user, args.python, not args.no_install)
    if why is not None:
        print(f"bench.launch cannot run here: {why}", file=sys.stderr)
        emit("launch", f"launch: skipped ({why})", {"skipped": why})
        return 2
    base = floor(args.user, args.python, args.in_flight)
    root = Path(tempfile.mkdtemp(prefix="labelrm-bench-agent-", dir="/tmp"))
    root.chmod(0o755)
    agent = None
    tree = TreeCpu(f"labelrm-bench-launch-{os.getpid()}")
    # The EngineConns' cgroups under the tree's: their CPU counts in the tree's figure.
    cgroup_parent = f"/labelrm-bench-launch-{os.getpid()}/engineconns"
    try:
        with stack(args.database_url) as (db, server):
            agent = start_agent(server.target, args.user, args.python, root, cgroup_parent)
            tree.add(agent.pid)  # before it launches anything: its children follow it
            plan = [(1, min(10.0, args.seconds)), (args.in_flight, args.seconds)]
            pids = {"server": server.pids, "agent": [agent.pid]}

            one, many = asyncio.run(
                launches(server.target, args.user, plan, pids, tree, db.postgres_pids)
            )
            describe = db.describe
    finally:
        if agent is not None and agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                agent.kill()
        remove_agent_cgroups(cgroup_parent, tree)
        tree.remove()
        shutil.rmtree(root, ignore_errors=True)

    bare = base["sudo"]["p50_ms"] + base["python"]["p50_ms"]
    targets = {
        "create_to_ready_p50_ms": one["p50_ms"],
        "overhead_p50_ms": round(one["p50_ms"] - bare, 1),
        "launches_per_s_in_flight": many["launches_per_s"],
    }
    rows = [
        [name, ms(b["p50_ms"]), ms(b["p99_ms"]), "", "", b["per_s_in_flight"]]
        for name, b in (
            ("sudo -n -u USER bash -c true", base["sudo"]),
            ("PYTHON -m engineconn --version", base["python"]),
            ("sudo -n -u USER PYTHON -m engineconn --version", base["sudo_python"]),
        )
    ]
    rows.append(
        [
            "labelrm CreateEngineConn -> ready",
            ms(one["p50_ms"]),
            ms(one["p99_ms"]),
            ms(many["p50_ms"]),
            ms(many["p99_ms"]),
            many["launches_per_s"],
        ]
    )
    n = args.in_flight
    text = "\n".join(
        [
            f"EngineConn launch: {describe}; rm-server + ecm-agent (product defaults), user {args.user}, engine shell-1; PYTHON={args.python}",
            table(
                [
                    "what",
                    "p50 ms (1 at a time)",
                    "p99 ms",
                    f"p50 ms ({n} in flight)",
                    "p99 ms",
                    f"per s ({n} in flight)",
                ],
                rows,
            ),
            f"overhead over bare sudo + bare python start (p50, 1 at a time): {targets['overhead_p50_ms']} ms",
            f"CPU in cores with {n} in flight: RM {many['cpu'].get('server')}, agent {many['cpu'].get('agent')}, "
            f"other {many['cpu'].get('other')} (the EngineConns and sudo themselves, and anything else running)",
            "CPU ms per launch (1 at a time / "
            + f"{n} in flight): "
            + ", ".join(
                f"{label} {one['cpu_per_launch'][key]} / {many['cpu_per_launch'][key]}"
                for label, key in (
                    ("RM", "rm_ms"),
                    ("agent", "agent_ms"),
                    ("sudo + EngineConns", "engineconns_ms"),
                    ("total", "total_ms"),
                    ("(PostgreSQL", "postgres_ms"),
                )
            )
            + ")",
        ]
        + (
            [f"errors: {one['errors']} / {many['errors']}"]
            if one["errors"] or many["errors"]
            else []
        )
    )
    emit(
        "launch",
        text,
        {
            "database": describe,
            "floor": base,
            "one_at_a_time": one,
            "in_flight": many,
            "targets": targets,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
