"""The operator's view: rmctl run as a real process (its own interpreter, its own exit)
against a real RM, a real agent and real EngineConns launched through sudo."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as rm_pb

from labelrm_client import AsyncRMClient, ResourceExhausted, load, load_instance
from tests.cli import rmctl_run
from tests.support.agents import start_agent
from tests.support.env import ROOT
from tests.support.waiting import wait_until

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"


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
        sys.executable, "-m", "rmctl", "--rm", "127.0.0.1:1", "node", "list",
        "--rm", rm.target, "-o", "name",
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    printed, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    assert sorted(printed.decode().split()) == ["node/node-a", "node/node-b"]

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
            sys.executable, "-m", "rmctl", "--rm", rm.target, "limit", "list", "-w",
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
    # resource show takes the labels in any order.
    shown = [
        (await rmctl_run(rm, "resource", "show", labels))[1]
        for labels in (
            "userCreator=alice-IDE,engineType=spark-3",
            "engineType=spark-3,userCreator=alice-IDE",
        )
    ]
    assert shown[0] == shown[1] and "mem=512Mi cpu=500m" in shown[0]
    assert "memory_bytes: requested 1Gi, available 512Mi" in [
        str(s).split(" ", 1)[1] for s in refused.value.shortfalls
    ]


async def test_node_list_filters_lost_age_out_and_rm(rm_manual_clock: Any) -> None:
    """-l on labels in any order; a node LOST for over an hour leaves the default list (-A
    shows it); `node rm` removes a LOST node and refuses a running one."""
    rm = rm_manual_clock  # its clock is months behind: what it records is long past
    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        for name, labels in (("gpu-1", "zone=a,kind=gpu"), ("cpu-1", "zone=a,kind=cpu")):
            await client.register_ecm(name, load_instance(8 << 30, 4000, 8), labels=labels)
        rc, out, err = await rmctl_run(rm, "node", "list", "-l", "kind=gpu,zone=a", "--no-headers")
        assert rc == 0 and [line.split()[0] for line in out.splitlines()] == ["gpu-1"], err
        rc, out, _ = await rmctl_run(rm, "node", "list", "--selector", "zone=b")
        assert rc == 0 and len(out.splitlines()) == 1  # the header: a valid, empty match
        rc, out, err = await rmctl_run(rm, "node", "list", "-l", "zone")
        assert rc == 2 and "selector 'zone' is not key=value" in err
        rc, out, err = await rmctl_run(rm, "node", "rm", "gpu")
        assert rc == 1 and "RUNNING" in err and "node decommission gpu-1" in err

        # gpu-1 goes silent past the expiry: LOST, its last heartbeat months ago.
        rm.clock.advance(rm.server.hub.settings.ecm_expiry.total_seconds() + 1)
        await client.register_ecm("cpu-1", load_instance(8 << 30, 4000, 8), labels="zone=a")
        await rm.server.hub.sweep()
        assert (await client.get_ecm("gpu-1")).state == rm_pb.ECM_STATE_LOST
    rc, out, _ = await rmctl_run(rm, "node", "list", "--no-headers")
    assert [line.split()[0] for line in out.splitlines()] == ["cpu-1"]
    rc, out, _ = await rmctl_run(rm, "node", "list", "-A", "--no-headers", "--sort-by", "instance")
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["cpu-1", "RUNNING"],
        ["gpu-1", "LOST"],
    ]
    rc, out, err = await rmctl_run(rm, "node", "rm", "gpu")
    assert (rc, out) == (0, "removed gpu-1 (0 tickets released)\n"), err
    rc, out, _ = await rmctl_run(rm, "node", "list", "-A", "-o", "name")
    assert out == "node/cpu-1\n"


async def test_engineconn_list_live_by_default_and_filters(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """Live EngineConns by default, -A for ended ones; states in any case and repeatable;
    --ecm by prefix; -l; an unknown filter value is an error, not an empty list."""
    rm = cluster_rm
    await start_agent(rm, agent_factory, "agent1")
    ids = []
    for engine in ("shell-1", "python-3"):
        labels = f"userCreator=lrmtest_a-IDE,engineType={engine}"
        rc, out, err = await rmctl_run(
            rm, "engineconn", "create", "--labels", labels, "-q", deadline=60
        )
        assert rc == 0, err
        ids.append(out.strip())
    shell, python = ids
    rc, out, err = await rmctl_run(rm, "engineconn", "kill", shell)
    assert rc == 0, err
    async with AsyncRMClient(rm.target, timeout=10.0) as client:

        async def ended() -> bool:
            return (await client.get_engine_conn(shell)).state in (
                ec_pb.ENGINE_CONN_STATE_SUCCEEDED,
                ec_pb.ENGINE_CONN_STATE_FAILED,
            )

        await wait_until(ended, timeout=30)

    async def listed(*argv: str) -> list[str]:
        rc, out, err = await rmctl_run(rm, "engineconn", "list", "--no-headers", *argv)
        assert rc == 0, err
        return [line.split()[0] for line in out.splitlines()]

    rc, out, _ = await rmctl_run(rm, "engineconn", "list")
    assert out.splitlines()[0].split()[-1] == "AGE"
    assert await listed() == [python]
    assert sorted(await listed("-A")) == sorted(ids)
    assert await listed("--state", "IDLE", "--state", "succeeded", "--state", "Failed") in (
        [python, shell],
        [shell, python],
    )
    assert await listed("-A", "-l", "engineType=shell-1,userCreator=lrmtest_a-IDE") == [shell]
    assert await listed("--ecm", "agent") == [python]
    assert await listed("-A", "--sort-by", "age") == [python, shell]  # youngest first
    rc, _, err = await rmctl_run(rm, "engineconn", "list", "--state", "sleepy")
    assert rc == 2 and "unknown state 'sleepy'" in err and "usage: rmctl engineconn list" in err
    rc, _, err = await rmctl_run(rm, "engineconn", "list", "--ecm", "nowhere")
    assert rc == 1 and "NOT_FOUND" in err

    # describe: the detail view, then every state it entered, oldest first, with reasons.
    rc, out, err = await rmctl_run(rm, "describe", "engineconn", shell[:10])
    assert rc == 0, err
    detail, events = out.split("\nEvents:\n")
    assert f"engine_conn_id  = {shell}" in detail or shell in detail.splitlines()[0]
    rows = [line.split() for line in events.splitlines()]
    assert rows[0] == ["TIME", "AGE", "STATE", "REASON"]
    states = [r[2] for r in rows[1:]]
    assert states[:2] == ["STARTING", "IDLE"] and states[-1] in ("SUCCEEDED", "FAILED")
    assert "SHUTTING_DOWN" in states
    rc, out, err = await rmctl_run(rm, "describe", "node", "agent")
    assert rc == 0, err
    assert [r.split()[2] for r in out.split("\nEvents:\n")[1].splitlines()[1:]] == ["REGISTERED"]
    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        ticket = (await client.get_engine_conn(python)).ticket_id
    rc, out, err = await rmctl_run(rm, "describe", "ticket", ticket)
    assert rc == 0, err
    assert out.split("\nEvents:\n")[1].splitlines()[1].split()[2] == "LOCKED"
    rc, out, err = await rmctl_run(rm, "describe", "pod", "x")
    assert rc == 2 and "invalid choice: 'pod'" in err
    await rmctl_run(rm, "engineconn", "kill", python)


async def test_status_and_top(rm: Any) -> None:
    """`rmctl status`: the cluster on one screen; `rmctl top`: usage by user and label."""
    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        await client.register_ecm("node-a", load_instance(8 << 30, 4000, 8))
        await client.register_ecm("node-b", load_instance(8 << 30, 4000, 8))
        await client.set_label_limit("userCreator=alice-IDE,engineType=*", load(4 << 30, 2000))
        for user, size in (("alice", 3 << 30), ("bob", 1 << 30)):
            await client.apply(
                f"userCreator={user}-IDE,engineType=spark-3,emInstance=node-a",
                load_instance(size, 1000, 1),
            )
    rc, out, err = await rmctl_run(rm, "status")
    assert rc == 0, err
    view = dict(line.split(" = ", 1) for line in out.split("\n\n")[0].splitlines())
    view = {k.strip(): v for k, v in view.items()}
    assert view["rm"].startswith(f"{rm.target} version ")
    assert view["replicas"].startswith("1: ")
    assert "PostgreSQL" in view["database"]
    assert view["nodes"] == "2: 2 RUNNING"
    assert view["engineconns"] == "0 live: none"
    assert view["total"] == "mem=16Gi cpu=8 inst=16"
    assert view["locked"] == "mem=4Gi cpu=2 inst=2"
    assert view["left"] == "mem=12Gi cpu=6 inst=14"
    assert view["waiting_applies"] == "0" and view["demands"] == "0: none"
    labels = out.split("most loaded labels:\n", 1)[1].splitlines()
    assert labels[0].split()[:2] == ["LABEL", "LOAD"]
    assert labels[1].split()[:2] == ["userCreator=alice-IDE,engineType=spark-3", "75%"]

    rc, out, _ = await rmctl_run(rm, "top")
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["USER", "MEMORY", "CPU", "INSTANCES", "TICKETS"]
    assert [r[:2] for r in rows[1:]] == [["alice", "3Gi"], ["bob", "1Gi"]]
    rc, out, _ = await rmctl_run(rm, "top", "--by", "label")
    assert out.splitlines()[1].split()[:2] == ["userCreator=alice-IDE,engineType=spark-3", "75%"]
    rc, out, _ = await rmctl_run(rm, "--version")
    assert rc == 0 and out.startswith("rmctl ")


def _events(out: str) -> list[list[str]]:
    """The Events table of `rmctl describe` as [state, reason] rows (header checked)."""
    rows = out.split("\nEvents:\n", 1)[1].splitlines()
    assert rows[0].split() == ["TIME", "AGE", "STATE", "REASON"]
    return [line.split(None, 3)[2:] for line in rows[1:]]


async def test_describe_ticket_and_demand_events(rm: Any) -> None:
    """`rmctl describe ticket|demand`: the detail, then the states it went through with
    their reasons, read from the RM's records (a ticket's own times once it has ended; a
    demand's transitions), through ListEvents like the EngineConns' and nodes'. And
    `rmctl demand list -l` selects on labels like every other list."""
    labels = "userCreator=alice-IDE,engineType=spark-3,emInstance=node-a"
    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        await client.register_ecm("node-a", load_instance(8 << 30, 4000, 8))
        live = (await client.apply(labels, load_instance(1 << 30, 1000, 1))).ticket_id
        ended = (await client.apply(labels, load_instance(1 << 30, 1000, 1))).ticket_id
        await client.report_used(ended)
        await client.release(ended)

    rc, out, err = await rmctl_run(rm, "describe", "ticket", live)
    assert rc == 0, err
    assert live in out.split("\nEvents:\n")[0]
    assert _events(out) == [["LOCKED", "applied"]]
    rc, out, err = await rmctl_run(rm, "describe", "ticket", ended)  # from its history
    assert rc == 0, err
    events = _events(out)
    assert [e[0] for e in events] == ["LOCKED", "USED", "RELEASED"]
    assert events[1] == ["USED", "reported used"] and events[2][1] != "-"

    rc, out, err = await rmctl_run(
        rm, "demand", "submit", "nightly", "--labels", labels, "--memory", "1Gi",
        "--cpu", "1", "--user", "alice", "--when", "{Start: [+1h, +2h]}",
    )  # fmt: skip
    assert rc == 0, err
    rc, out, err = await rmctl_run(
        rm, "demand", "cancel", "nightly", "--reason", "not tonight", "--user", "alice"
    )
    assert rc == 0, err
    rc, out, err = await rmctl_run(
        rm, "demand", "submit", "other", "--labels", labels.replace("spark-3", "hive-2"),
        "--memory", "1Gi", "--cpu", "1", "--user", "alice", "--when", "{Start: [+1h, +2h]}",
    )  # fmt: skip
    assert rc == 0, err

    async def listed(*argv: str) -> list[str]:
        rc, out, err = await rmctl_run(rm, "demand", "list", "--no-headers", *argv)
        assert rc == 0, err
        return [line.split()[0] for line in out.splitlines()]

    assert await listed() == ["nightly", "other"]
    assert await listed("-l", "engineType=hive-2") == ["other"]
    assert await listed("--selector", "emInstance=node-a,engineType=spark-3") == ["nightly"]
    assert await listed("-l", "engineType=spark-3", "-l", "userCreator=bob-IDE") == []
    rc, out, err = await rmctl_run(rm, "demand", "list", "-l", "engineType")
    assert rc == 2 and "selector 'engineType' is not key=value" in err

    rc, out, err = await rmctl_run(rm, "describe", "demand", "nightly")
    assert rc == 0, err
    detail = out.split("\nEvents:\n")[0]
    assert "nightly" in detail and "alice" in detail
    events = _events(out)
    assert events[0][0] == "NEW" and events[-1] == ["FAILED", "cancelled: not tonight"], events
    rc, out, err = await rmctl_run(rm, "describe", "demand", "nightly", "--user", "bob")
    assert rc == 1 and "NOT_FOUND" in err, (out, err)
    rc, out, err = await rmctl_run(rm, "describe", "ticket", "no-such-ticket")
    assert rc == 1 and "NOT_FOUND" in err, (out, err)
