"""The operator's view: rmctl run as a real process (its own interpreter, its own exit)
against a real RM, a real agent and real EngineConns launched through sudo."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from clients import AsyncRMClient, ResourceExhausted, load, load_instance
from tests.conftest import ROOT, wait_until

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"


async def rmctl_run(rm: Any, *argv: str, deadline: float = 30.0) -> tuple[int, str, str]:
    """rmctl in a subprocess: (exit code, stdout, stderr). A process still running at the
    deadline is killed and the test fails: rmctl must always exit on its own."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "clients.rmctl",
        "--rm",
        rm.target,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), deadline)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(
            f"rmctl {' '.join(argv)} still running after {deadline}s; printed {out!r} {err!r}"
        ) from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def start_agent(rm: Any, agent_factory: Any, agent_id: str = "agent1") -> Any:
    agent = agent_factory(rm.target, agent_id)
    agent.start()
    async with AsyncRMClient(rm.target, timeout=10.0) as client:

        async def running() -> bool:
            ecms = [e async for e in client.list_ecms()]
            return any(e.instance == agent_id and e.HasField("last_heartbeat_time") for e in ecms)

        await wait_until(running, timeout=30)
    return agent


async def test_exec_by_id_prefix_always_exits(cluster_rm: Any, agent_factory: Any) -> None:
    """`engineconn exec <prefix>` prints the output and exits, every time (it used to
    hang in most tries: the output generator was left to the garbage collector)."""
    await start_agent(cluster_rm, agent_factory)
    rc, out, err = await rmctl_run(
        cluster_rm, "engineconn", "create", "--labels", SHELL_A, "-q", deadline=60
    )
    assert rc == 0, err
    ec_id = out.strip()
    for attempt in range(20):
        rc, out, err = await rmctl_run(
            cluster_rm, "engineconn", "exec", ec_id[:8], f"echo run-{attempt}"
        )
        assert (rc, out) == (0, f"run-{attempt}\n"), err
    rc, out, err = await rmctl_run(cluster_rm, "engineconn", "exec", ec_id[:8], "exit 4")
    assert rc == 4
    # The engine stops code at --exec-timeout (default one hour, not unbounded).
    rc, out, err = await rmctl_run(
        cluster_rm, "engineconn", "exec", ec_id, "sleep 120", "--exec-timeout", "1"
    )
    assert rc != 0 and "timed out" in err, (rc, err)
    rc, out, err = await rmctl_run(cluster_rm, "engineconn", "exec", "--help")
    assert "--exec-timeout" in out and "default 3600" in out


async def test_global_flags_anywhere_and_output_modes(rm: Any) -> None:
    """`-o`, `--rm`, `--no-headers` after the subcommand; yaml and name views; an error
    shows the subcommand's usage."""
    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        await client.register_ecm("node-b", load_instance(8 << 30, 4000, 8))
        await client.register_ecm("node-a", load_instance(8 << 30, 4000, 8))
    before = await rmctl_run(rm, "-o", "json", "node", "list")
    after = await rmctl_run(rm, "node", "list", "-o", "json")
    assert before[0] == 0 and after == before
    names = [e["instance"] for e in json.loads(after[1])["ecms"]]
    assert sorted(names) == ["node-a", "node-b"]
    # --rm after the subcommand wins over the one before it (a dead address).
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clients.rmctl", "--rm", "127.0.0.1:1", "node", "list",
        "--rm", rm.target, "-o", "name",
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    assert sorted(out.decode().split()) == ["node/node-a", "node/node-b"]

    rc, out, _ = await rmctl_run(rm, "node", "list", "-o", "yaml")
    assert rc == 0 and out.startswith("ecms:\n  - instance: node-")
    assert "    total_resource:\n      load_instance:\n        memory_bytes: " in out
    rc, out, _ = await rmctl_run(rm, "node", "list", "--no-headers")
    assert rc == 0 and [line.split()[0] for line in out.splitlines()] == names

    rc, out, err = await rmctl_run(rm, "node", "list", "--bogus")
    assert rc == 2 and out == ""
    assert err.startswith("usage: rmctl node list") and "unrecognized arguments: --bogus" in err


async def test_watch_json_streams_one_object_per_change(rm: Any) -> None:
    """`-w -o json`: one line per object that appeared or changed, not a snapshot per round."""
    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        await client.set_label_limit("userCreator=alice-IDE", load(4 << 30, 2000))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clients.rmctl", "--rm", rm.target, "limit", "list", "-w",
            "-o", "json", "--watch-interval", "0.1", "--watch-rounds", "600",
            stdout=asyncio.subprocess.PIPE, cwd=ROOT,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
            assert first["type"] == "ADDED"
            assert first["object"]["pattern"] == "userCreator=alice-IDE"
            await client.set_label_limit("userCreator=bob-IDE", load(2 << 30, 1000))
            second = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
            assert (second["type"], second["object"]["pattern"]) == (
                "ADDED",
                "userCreator=bob-IDE",
            )
            await client.set_label_limit("userCreator=alice-IDE", load(8 << 30, 2000))
            third = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
            assert (third["type"], third["object"]["pattern"]) == (
                "MODIFIED",
                "userCreator=alice-IDE",
            )
        finally:
            proc.kill()
            await proc.wait()


async def test_quantities_in_and_out(rm: Any) -> None:
    """--cpu 500m / 2, --memory 512Mi / 2Gi / 1G in; human units in tables and refusals."""
    rc, out, err = await rmctl_run(
        rm, "-o", "json", "limit", "set", "userCreator=alice-IDE,engineType=*", "--memory", "512Mi",
        "--cpu", "500m",
    )  # fmt: skip
    assert rc == 0, err
    got = json.loads(out)["max_resource"]["load"]
    assert (int(got["memory_bytes"]), int(got["cpu_millis"])) == (512 << 20, 500)
    rc, out, err = await rmctl_run(
        rm, "-o", "json", "limit", "set", "userCreator=bob-IDE", "--memory", "1G", "--cpu", "2"
    )
    got = json.loads(out)["max_resource"]["load"]
    assert (int(got["memory_bytes"]), int(got["cpu_millis"])) == (10**9, 2000)
    rc, out, err = await rmctl_run(rm, "limit", "set", "a=b", "--memory", "lots", "--cpu", "1")
    assert rc == 2 and "invalid memory quantity 'lots'" in err

    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        # A host's MemTotal is rarely a whole number of GiB: 24684096 KiB.
        await client.register_ecm("node-a", load_instance(24684096 * 1024, 2000, 8))
        rc, out, _ = await rmctl_run(rm, "node", "list")
        assert "mem=23.5Gi cpu=2 inst=8" in out and "Ki" not in out
        with pytest.raises(ResourceExhausted) as refused:
            await client.apply("userCreator=alice-IDE,engineType=spark-3", load(1 << 30, 100))
    assert "memory_bytes: requested 1Gi, available 512Mi" in str(refused.value)
    assert "memory_bytes: requested 1Gi, available 512Mi" in [
        str(s).split(" ", 1)[1] for s in refused.value.shortfalls
    ]
