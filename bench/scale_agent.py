"""The ecm-agent's memory as launches accumulate: a part of bench/scale.py.

A real ecm-agent, started as bench/launch.py starts it (root, product defaults, so with
its fork servers), launches EngineConns through sudo as a test user and kills them:
`in_flight` clients loop CreateEngineConn (engineType shell-1) -> ready -> KillEngineConn.
The agent's RSS is read after `first` launches and after `factor` x as many, each time
once every EngineConn has ended and been cleaned up (nothing live: what is left is what
the agent keeps). Target: RSS after the last / after the first <= 1.2 (no leak).
Alongside, what would show state kept per EngineConn: the agent's open file descriptors,
its threads and the state files left in its state directory.

Needs root and the test users (scripts/create_test_users.sh) and the EngineConn runtime
(scripts/install_ec_runtime.sh; LABELRM_EC_VENV names it), as bench/launch.py does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import CpuMeter, stack
from bench.launch import (
    EngineConns,
    preconditions,
    remove_agent_cgroups,
    start_agent,
    wait_registered,
)
from bench.scale_parts import progress


def _agent_figures(pid: int, state_dir: Path) -> dict[str, Any]:
    import psutil

    proc = psutil.Process(pid)
    try:
        state_files = len(list(state_dir.iterdir()))
    except OSError:
        state_files = 0
    return {
        "rss_mib": round(float(proc.memory_info().rss) / 2**20, 1),
        "fds": proc.num_fds(),
        "threads": proc.num_threads(),
        "state_files": state_files,
    }


async def _launch_and_kill(
    target: str,
    user: str,
    marks: list[int],
    in_flight: int,
    sample: Any,
) -> dict[str, Any]:
    """Launches EngineConns until each of `marks` (cumulative launches) is reached; at
    each mark, once nothing is live any more, `sample(launches)`. Returns the counts."""
    import grpc
    from labelrm.v1 import resource_manager_pb2_grpc

    errors: dict[str, int] = {}
    launched = 0
    async with grpc.aio.insecure_channel(target) as ch:
        ecs = EngineConns(ch, user)
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(ch)
        await wait_registered(rm, "bench-agent")

        async def client(stop_at: int) -> None:
            nonlocal launched
            while launched < stop_at:
                launched += 1
                try:
                    await ecs.kill((await ecs.create()).engine_conn_id)
                except grpc.aio.AioRpcError as exc:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                    await asyncio.sleep(0.1)

        for mark in marks:
            await asyncio.gather(*(client(mark) for _ in range(in_flight)))
            await ecs.drained(120, 3.0)
            sample(launched)
    return {"launches": launched, "errors": errors}


def agent_memory_run(
    database_url: str,
    first: int,
    factor: int,
    *,
    user: str = "lrmtest_a",
    python: str = "",
    in_flight: int = 8,
) -> dict[str, Any]:
    """The agent's RSS after `first` launches and after `factor` x as many (and at each
    multiple of `first` between, for the trend); {"skipped": why} when it cannot run."""
    import psutil

    python = python or os.environ.get("LABELRM_EC_VENV", "/opt/labelrm/ec-venv") + "/bin/python"
    why = preconditions(user, python, install=False)
    if why is not None:
        return {"skipped": why}
    root = Path(tempfile.mkdtemp(prefix="labelrm-bench-agent-", dir="/tmp"))
    root.chmod(0o755)
    agent = None
    cgroup_parent = f"labelrm-bench-agent-{os.getpid()}"  # under this process's cgroups
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        with stack(database_url, ["--ecm-expiry", "86400"]) as (_db, server):
            # The machine's own load before the run (the run's `other` includes the
            # EngineConns and sudo, which the agent starts).
            idle = CpuMeter({"server": server.pids})
            idle.start()
            time.sleep(3.0)
            idle_cpu = idle.stop()
            agent = start_agent(server.target, user, python, root, cgroup_parent)
            pid = agent.pid
            assert server.proc is not None
            rm_pid = server.proc.pid
            meter = CpuMeter({"server": server.pids, "agent": [pid]})
            meter.start()

            def sample(launches: int) -> None:
                samples.append(
                    {
                        "launches": launches,
                        "seconds": round(time.monotonic() - t0, 1),
                        **_agent_figures(pid, root / "state"),
                        # The RM's side of the same launches (EngineConn rows, commands).
                        "rm_rss_mib": round(
                            float(psutil.Process(rm_pid).memory_info().rss) / 2**20, 1
                        ),
                    }
                )
                progress("agent memory", samples[-1])

            marks = [first * k for k in range(1, factor + 1)]
            counts = asyncio.run(_launch_and_kill(server.target, user, marks, in_flight, sample))
            cpu = meter.stop()
    finally:
        if agent is not None and agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                agent.kill()
        remove_agent_cgroups(cgroup_parent)
        shutil.rmtree(root, ignore_errors=True)
    seconds = round(time.monotonic() - t0, 1)
    return {
        "user": user,
        "in_flight": in_flight,
        "seconds": seconds,
        "launches_per_s": round(counts["launches"] / seconds, 1) if seconds else None,
        "errors": counts["errors"],
        "cpu": cpu,
        "cpu_before": idle_cpu,
        "small": samples[0],
        "large": samples[-1],
        "samples": samples,
    }


def agent_memory_target(mem: dict[str, Any]) -> tuple[str, float | None, bool | None, str]:
    """The table row of an agent_memory_run result: (measure, ratio, met, figures)."""
    name = "ecm-agent RSS after 10 x N launches / after N <= 1.2"
    if "skipped" in mem:
        return name, None, None, f"skipped: {mem['skipped']}"
    small, large = mem["small"], mem["large"]
    x = round(large["rss_mib"] / small["rss_mib"], 2) if small["rss_mib"] else None
    return (
        name,
        x,
        x is not None and x <= 1.2,
        f"{small['launches']} launches {small['rss_mib']} MiB -> {large['launches']}"
        f" launches {large['rss_mib']} MiB in {mem['seconds']} s ({mem['launches_per_s']}/s,"
        f" other {mem['cpu_before'].get('other')} cores before); fds {small['fds']} ->"
        f" {large['fds']}, state files {small['state_files']} -> {large['state_files']};"
        f" the RM {small['rm_rss_mib']} -> {large['rm_rss_mib']} MiB",
    )
