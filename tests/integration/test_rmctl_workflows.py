"""Workflows an operator finishes with rmctl alone, each run as real rmctl processes
against a real RM, agent and EngineConns: cancelling an execution (Ctrl-C, `engineconn
cancel`), releasing a ticket, cordoning and draining a node."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from labelrm_client import AsyncRMClient, load_instance
from labelrm_common.quantity import format_bytes, format_cpu
from tests.cli import rmctl_run, rmctl_spawn
from tests.support.agents import start_agent
from tests.support.waiting import wait_until

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"
SPARK = "userCreator=alice-IDE,engineType=spark-3.2.1"
LIMIT = "userCreator=*,engineType=*"
PYTHON_A = "userCreator=lrmtest_a-IDE,engineType=python-3"
IDLE, BUSY = "ENGINE_CONN_STATE_IDLE", "ENGINE_CONN_STATE_BUSY"


async def _shell_engine_conn(rm: Any, agent_factory: Any) -> str:
    await start_agent(rm, agent_factory)
    rc, out, err = await rmctl_run(
        rm, "engineconn", "create", "--labels", SHELL_A, "-q", deadline=90
    )
    assert rc == 0, err
    return out.strip()


async def _started(proc: asyncio.subprocess.Process, marker: str) -> None:
    """Wait (bounded) until the execution printed `marker`: the code is running."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line.decode().strip() == marker, line


async def _interrupted(rm: Any, ec_id: str, code: str) -> str:
    """`engineconn exec` of `code` (which prints "started" first), Ctrl-C once it runs;
    rmctl's stderr after it exited 130."""
    proc = await rmctl_spawn(rm, "engineconn", "exec", ec_id, code)
    await _started(proc, "started")
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 130, err
    return err.decode()


async def test_ctrl_c_cancels_the_execution(cluster_rm: Any, agent_factory: Any) -> None:
    """Ctrl-C on `engineconn exec` stops the code and waits for it: the EngineConn is IDLE
    when rmctl returns, and the next exec runs at once."""
    ec_id = await _shell_engine_conn(cluster_rm, agent_factory)
    err = await _interrupted(cluster_rm, ec_id, "echo started; sleep 300")
    assert err.splitlines()[-1].endswith(" cancelled"), err
    assert (await _json(cluster_rm, "engineconn", "status", ec_id))["state"] == IDLE
    rc, out, err = await rmctl_run(cluster_rm, "engineconn", "exec", ec_id, "echo next")
    assert (rc, out) == (0, "next\n"), err


async def test_ctrl_c_stops_python_code_blocked_in_a_call(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """The python engine's code is interrupted in a blocking call too: Ctrl-C on a
    `time.sleep(3600)` leaves the EngineConn IDLE when rmctl returns (it stayed BUSY for
    the whole sleep when code ran on a worker thread)."""
    ec_id = await _python_engine_conn(cluster_rm, agent_factory)
    err = await _interrupted(cluster_rm, ec_id, _PY_STARTED + "import time\ntime.sleep(3600)")
    assert err.splitlines()[-1].endswith(" cancelled"), err
    assert (await _json(cluster_rm, "engineconn", "status", ec_id))["state"] == IDLE


async def test_ctrl_c_on_code_that_cannot_stop_says_so(cluster_rm: Any, agent_factory: Any) -> None:
    """Code that catches the interrupt and goes on does not stop: rmctl says the
    EngineConn stays BUSY and what to do, not "execution cancelled"."""
    ec_id = await _python_engine_conn(cluster_rm, agent_factory)
    code = _PY_STARTED + (
        "import time\nwhile True:\n    try:\n        time.sleep(3600)\n"
        "    except KeyboardInterrupt:\n        pass\n"
    )
    err = await _interrupted(cluster_rm, ec_id, code)
    assert "execution cancelled" not in err
    assert f"EngineConn {ec_id} stays BUSY until the code ends" in err
    assert f"`rmctl engineconn kill {ec_id}`" in err
    assert (await _json(cluster_rm, "engineconn", "status", ec_id))["state"] == BUSY
    rc, _, err = await rmctl_run(cluster_rm, "engineconn", "kill", ec_id)
    assert rc == 0, err


_PY_STARTED = "print('started', flush=True)\n"


async def _python_engine_conn(rm: Any, agent_factory: Any) -> str:
    await start_agent(rm, agent_factory)
    rc, out, err = await rmctl_run(
        rm, "engineconn", "create", "--labels", PYTHON_A, "-q", deadline=90
    )
    assert rc == 0, err
    return out.strip()


async def test_engineconn_cancel(cluster_rm: Any, agent_factory: Any) -> None:
    """`rmctl engineconn cancel ID` stops what another rmctl runs there (it exits 130,
    saying so) and returns once the EngineConn is IDLE; with nothing running it says so."""
    ec_id = await _shell_engine_conn(cluster_rm, agent_factory)
    proc = await rmctl_spawn(cluster_rm, "engineconn", "exec", ec_id, "echo started; sleep 300")
    await _started(proc, "started")
    rc, out, err = await rmctl_run(cluster_rm, "engineconn", "cancel", ec_id[:10])
    assert (rc, out) == (0, f"{ec_id} IDLE: execution cancelled\n"), err
    _, exec_err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 130
    assert "cancelled (by `rmctl engineconn cancel` or another client)" in exec_err.decode()
    rc, out, err = await rmctl_run(cluster_rm, "engineconn", "cancel", ec_id)
    assert (rc, out) == (0, f"{ec_id} IDLE: nothing was running\n"), err


async def _json(rm: Any, *argv: str) -> Any:
    rc, out, err = await rmctl_run(rm, "-o", "json", *argv)
    assert rc == 0, err
    return json.loads(out)


async def _demand_reaches(rm: Any, demand_id: str, state: str) -> None:
    async def there() -> bool:
        return bool((await _json(rm, "demand", "show", demand_id))["state"] == state)

    await wait_until(there, 30, what=f"demand {demand_id} {state}", interval=0.2)


async def test_the_demand_workflow_ends_with_ticket_release(rm: Any) -> None:
    """docs/demands.md's quick start, all with rmctl: submit, claim, then release the
    claimed ticket (grpcurl was needed for the last step)."""
    rc, _, err = await rmctl_run(rm, "limit", "set", LIMIT, "--memory", "4Gi", "--cpu", "4")
    assert rc == 0, err
    rc, _, err = await rmctl_run(
        rm, "demand", "submit", "etl-7", "--labels", SPARK, "--memory", "1Gi", "--cpu", "1"
    )
    assert rc == 0, err
    await _demand_reaches(rm, "etl-7", "DEMAND_STATE_ALLOCATED")  # the planner's rounds
    claimed = await _json(rm, "demand", "claim", "etl-7")
    ticket = claimed["ticket"]["ticket_id"]
    rc, out, err = await rmctl_run(rm, "ticket", "release", ticket[:12])
    assert (rc, out) == (0, f"{ticket} RELEASED: released\n"), err
    await _demand_reaches(rm, "etl-7", "DEMAND_STATE_FINISHED")  # at its next round
    # Idempotent: releasing again says how it ended, and changes nothing.
    rc, out, err = await rmctl_run(rm, "ticket", "release", ticket)
    assert (rc, out) == (0, f"{ticket} RELEASED: released\n"), err


async def test_ticket_apply_use_release(rm: Any) -> None:
    """A ticket's whole life with rmctl: apply (LOCKED), use part of it (USED; the
    dimension not given counts in full), release."""
    rc, _, err = await rmctl_run(rm, "limit", "set", LIMIT, "--memory", "4Gi", "--cpu", "4")
    assert rc == 0, err
    rc, out, err = await rmctl_run(
        rm, "ticket", "apply", "--labels", SPARK, "--memory", "2Gi", "--cpu", "2", "-q"
    )
    assert rc == 0, err
    ticket = out.strip()
    rc, out, err = await rmctl_run(rm, "ticket", "use", ticket, "--memory", "1Gi")
    assert (rc, out) == (0, f"{ticket} USED: mem=1Gi cpu=2 used\n"), err
    rc, out, err = await rmctl_run(rm, "ticket", "delete", ticket)
    assert rc == 0 and out.startswith(f"{ticket} RELEASED"), err
    shown = await _json(rm, "ticket", "show", ticket)
    assert shown["state"] == "TICKET_STATE_RELEASED"
    # Too much is refused by the RM with the shortfall, not by rmctl.
    rc, out, err = await rmctl_run(
        rm, "ticket", "apply", "--labels", SPARK, "--memory", "5Gi", "--cpu", "1"
    )
    assert rc == 1 and err.startswith("error: RESOURCE_EXHAUSTED"), err
    assert "memory_bytes: requested 5Gi, available 4Gi" in err


async def test_limit_set_changes_only_the_dimensions_given(rm: Any) -> None:
    """`limit set P --memory 1Gi` alone keeps the CPU (it demanded --cpu); a new limit
    without one says which flag is missing."""
    rc, _, err = await rmctl_run(rm, "limit", "set", LIMIT, "--memory", "4Gi", "--cpu", "4")
    assert rc == 0, err
    rc, _, err = await rmctl_run(rm, "limit", "set", LIMIT, "--memory", "1Gi")
    assert rc == 0, err
    (limit,) = (await _json(rm, "limit", "list"))["limits"]
    assert limit["max_resource"] == {"load": {"memory_bytes": "1073741824", "cpu_millis": "4000"}}
    rc, _, err = await rmctl_run(rm, "limit", "set", LIMIT, "--instances", "3")
    assert rc == 0, err
    (limit,) = (await _json(rm, "limit", "list"))["limits"]
    assert limit["max_resource"]["load_instance"] == {
        "memory_bytes": "1073741824", "cpu_millis": "4000", "instances": "3"
    }  # fmt: skip
    rc, out, err = await rmctl_run(rm, "limit", "set", "team=x", "--cpu", "2")
    assert (rc, out) == (1, ""), err
    assert err == "error: new limit team=x has no --memory to keep: give --memory\n"


async def test_logs_tail_and_since(cluster_rm: Any, agent_factory: Any) -> None:
    """`engineconn logs --tail N` prints the last N lines of each log; `--since` the lines
    stamped within the duration (all of a fresh EngineConn's stamped lines)."""
    ec_id = await _shell_engine_conn(cluster_rm, agent_factory)
    rc, _, err = await rmctl_run(cluster_rm, "engineconn", "exec", ec_id, "true")
    assert rc == 0, err
    logs = Path((await _json(cluster_rm, "engineconn", "status", ec_id))["work_dir"]) / "logs"
    rc, out, err = await rmctl_run(cluster_rm, "engineconn", "logs", ec_id, "--tail", "2")
    assert rc == 0, err
    lines = (logs / "stderr.log").read_text().splitlines()
    assert len(lines) > 2
    assert out.splitlines() == [f"==> {logs / 'stderr.log'} <==", *lines[-2:]]
    rc, out, err = await rmctl_run(cluster_rm, "engineconn", "logs", ec_id, "--since", "1h")
    assert rc == 0, err
    stamped = [line for line in lines if line[:4].isdigit()]
    assert stamped and set(stamped) <= set(out.splitlines())


# --- nodes -----------------------------------------------------------------------------------


async def _node(rm: Any, name: str) -> dict[str, Any]:
    return dict(await _json(rm, "node", "status", name))


async def test_cordon_uncordon_and_drain(cluster_rm: Any, agent_factory: Any) -> None:
    """cordon: no new work, what runs goes on; uncordon: new work again (and a
    decommission called off); drain: cordon and wait for the EngineConns to end, killing
    them at the deadline, the node staying registered. Each is in the node's history."""
    first = await _shell_engine_conn(cluster_rm, agent_factory)
    rc, out, err = await rmctl_run(
        cluster_rm, "node", "cordon", "agent1", "--reason", "kernel update"
    )
    assert (rc, out) == (0, "agent1 cordoned: no new work; 1 EngineConns go on running\n"), err
    rc, out, err = await rmctl_run(cluster_rm, "node", "list", "--no-headers")
    assert out.split()[:2] == ["agent1", "RUNNING,CORDONED"], err
    rc, out, err = await rmctl_run(
        cluster_rm, "engineconn", "create", "--labels", SHELL_A, "--start-timeout", "10"
    )
    assert rc == 1 and "health: cordoned (no new work)" in err, err
    rc, out, err = await rmctl_run(
        cluster_rm, "ticket", "apply", "--labels", f"emInstance=agent1,{SHELL_A}",
        "--memory", "1Mi", "--cpu", "1m",
    )  # fmt: skip
    assert rc == 1 and "ECM agent1 is CORDONED: it takes no new work" in err, err
    rc, out, err = await rmctl_run(cluster_rm, "engineconn", "exec", first, "echo still here")
    assert (rc, out) == (0, "still here\n"), err  # what runs goes on

    rc, out, err = await rmctl_run(cluster_rm, "node", "uncordon", "agent1")
    assert (rc, out) == (0, "agent1 RUNNING: takes new work\n"), err
    rc, out, err = await rmctl_run(
        cluster_rm, "engineconn", "create", "--labels", SHELL_A, "-q", deadline=90
    )
    assert rc == 0, err
    second = out.strip()
    rc, out, err = await rmctl_run(cluster_rm, "node", "decommission", "agent1")
    assert rc == 0 and "agent1 DRAINING: 2 live EngineConns" in out, err
    rc, out, err = await rmctl_run(cluster_rm, "node", "uncordon", "agent1")
    assert out == "agent1 RUNNING: takes new work (its decommission is called off)\n", err

    # Idle EngineConns do not end by themselves: the deadline kills them.
    rc, out, err = await rmctl_run(
        cluster_rm, "node", "drain", "agent1", "--deadline", "2s", deadline=120
    )
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "agent1 cordoned: waiting for 2 EngineConns to end (killed after 2s)"
    assert lines[1] == "deadline passed: killing 2 EngineConns"
    ended = sorted(line.split()[0] for line in lines[2:-1])
    assert ended == sorted([f"engineconn/{first}", f"engineconn/{second}"]), out
    assert lines[-1].startswith("agent1 drained: cordoned, no EngineConns")
    node = await _node(cluster_rm, "agent1")
    assert node["state"] == "ECM_STATE_RUNNING" and node["cordoned"] is True
    assert node["cordon_reason"] == "drained"

    rc, out, err = await rmctl_run(cluster_rm, "describe", "node", "agent1")
    assert rc == 0, err
    events = [line.split(None, 3)[2:] for line in out.split("Events:\n", 1)[1].splitlines()[1:]]
    assert [e[0] for e in events] == [
        "REGISTERED", "CORDONED", "UNCORDONED", "DRAINING", "RUNNING", "CORDONED"
    ]  # fmt: skip
    assert events[1] == ["CORDONED", "kernel update"] and events[-1] == ["CORDONED", "drained"]


async def test_a_node_keeps_its_history_after_it_leaves(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """Decommissioned, the node leaves; `describe node` still shows its history (it was
    deleted with the node)."""
    await start_agent(cluster_rm, agent_factory)
    rc, out, err = await rmctl_run(cluster_rm, "node", "decommission", "agent1")
    assert rc == 0, err

    async def gone() -> bool:
        rc, out, _ = await rmctl_run(cluster_rm, "node", "list", "-A", "--no-headers")
        return rc == 0 and out == ""

    await wait_until(gone, 30, what="agent1 gone", interval=0.5)
    rc, out, err = await rmctl_run(cluster_rm, "describe", "node", "agent1")
    assert rc == 0, err
    head, events = out.split("\nEvents:\n", 1)
    assert head.splitlines()[1].startswith("state    = not registered: LEFT ")
    states = [line.split(None, 3)[2:] for line in events.splitlines()[1:]]
    assert [s[0] for s in states] == ["REGISTERED", "DRAINING", "LEFT"]
    assert states[-1] == ["LEFT", "decommissioned"]


async def test_status_leaves_lost_nodes_out_of_the_totals(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """`rmctl status` counted a LOST node's capacity in the cluster's totals."""
    await start_agent(cluster_rm, agent_factory)
    async with AsyncRMClient(cluster_rm.target, timeout=10.0) as client:
        await client.register_ecm("ghost:1", load_instance(64 << 30, 32000, 64))  # never beats

    async def ghost_lost() -> bool:
        return bool((await _node(cluster_rm, "ghost:1"))["state"] == "ECM_STATE_LOST")

    await wait_until(ghost_lost, 30, what="ghost:1 LOST", interval=0.5)
    agent = await _node(cluster_rm, "agent1")
    dims = agent["total_resource"]["load_instance"]
    rc, out, err = await rmctl_run(cluster_rm, "status")
    assert rc == 0, err
    view = {
        k.strip(): v
        for k, v in (line.split(" = ", 1) for line in out.split("\n\n")[0].splitlines())
    }
    assert view["nodes"] == "2: 1 LOST, 1 RUNNING"
    assert view["total"] == (
        f"mem={format_bytes(int(dims['memory_bytes']))} cpu={format_cpu(int(dims['cpu_millis']))}"
        f" inst={dims['instances']} (without 1 LOST)"
    )


async def test_an_end_on_request_fails_only_the_work_it_cuts_short(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """A killed EngineConn ended SUCCEEDED ("signal SIGTERM"), a cancelled demand FAILED.
    One rule now: a stop on request is a failure exactly when it cuts work short. Killed
    during an execution, an EngineConn FAILED; killed while IDLE it SUCCEEDED; the reason
    is the kill's either way."""
    idle = await _shell_engine_conn(cluster_rm, agent_factory)
    rc, out, err = await rmctl_run(
        cluster_rm, "engineconn", "create", "--labels", SHELL_A, "-q", deadline=90
    )
    assert rc == 0, err
    busy = out.strip()
    proc = await rmctl_spawn(cluster_rm, "engineconn", "exec", busy, "echo started; sleep 300")
    await _started(proc, "started")
    for ec_id in (idle, busy):
        rc, _, err = await rmctl_run(cluster_rm, "engineconn", "kill", ec_id, "--reason", "upgrade")
        assert rc == 0, err
    await asyncio.wait_for(proc.communicate(), 60)

    async def ended(ec_id: str) -> dict[str, Any] | None:
        ec = await _json(cluster_rm, "engineconn", "status", ec_id)
        return ec if ec["state"] not in (IDLE, BUSY, "ENGINE_CONN_STATE_SHUTTING_DOWN") else None

    first = await wait_until(lambda: ended(idle), 30, what="the idle one ended")
    assert (first["state"], first["reason"]) == ("ENGINE_CONN_STATE_SUCCEEDED", "upgrade")
    second = await wait_until(lambda: ended(busy), 30, what="the busy one ended")
    assert second["state"] == "ENGINE_CONN_STATE_FAILED"
    assert second["reason"] == "upgrade: an execution was cut short (signal SIGTERM)"


async def test_engineconn_sizes_in_quantities(cluster_rm: Any, agent_factory: Any) -> None:
    """`engineconn create` took no --memory / --cpu, and `--param memory_bytes=512Mi` was
    refused: one quantity syntax wherever a user types an amount."""
    await start_agent(cluster_rm, agent_factory)
    for argv, memory, cpu in (
        (("--memory", "512Mi", "--cpu", "250m"), str(512 << 20), "250"),
        (("--param", "memory_bytes=256Mi", "--param", "cpu_millis=100m"), str(256 << 20), "100"),
    ):
        rc, out, err = await rmctl_run(
            cluster_rm, "engineconn", "create", "--labels", SHELL_A, "-q", *argv, deadline=90
        )
        assert rc == 0, err
        ec = await _json(cluster_rm, "engineconn", "status", out.strip())
        assert ec["resource"]["load_instance"]["memory_bytes"] == memory, ec
        assert ec["resource"]["load_instance"]["cpu_millis"] == cpu, ec
    rc, out, err = await rmctl_run(
        cluster_rm, "engineconn", "create", "--labels", SHELL_A, "--memory", "1Gi",
        "--param", "memory_bytes=1Gi",
    )  # fmt: skip
    assert (rc, err) == (1, "error: memory_bytes given both as a param and as memory\n")
