"""rmctl's `node` and `engineconn` commands against a real cluster: an in-process RM, a real
agent (root) launching through real sudo as a real unprivileged user, the real EngineConn
runtime. The RM serves on the test's event loop, so rmctl runs in a worker thread.

The last tests need no cluster: the log fallback when an EngineConn's files are not
readable here, and the start-up progress on a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf import json_format
from labelrm.v1 import engine_conn_pb2 as ec_pb

from labelrm_client import AsyncRMClient, ExecOutput, ExecResult, Unauthenticated
from rmctl.engineconn import with_progress
from rmctl.logs import cmd_ec_logs
from tests.support.agents import start_agent
from tests.support.sdk import ctl, details
from tests.support.waiting import wait_until, wait_until_sync

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"
ENDED = ("SUCCEEDED", "FAILED", "LOST")


@pytest.fixture
async def client(cluster_rm: Any) -> Any:
    async with AsyncRMClient(cluster_rm.target, timeout=10.0) as c:
        yield c


async def test_engineconn_lifecycle_through_rmctl(
    cluster_rm: Any, client: Any, agent_factory: Any, capsys: Any
) -> None:
    rm = cluster_rm
    await start_agent(rm, agent_factory)
    capsys.readouterr()

    assert await ctl(rm, "node", "list") == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "INSTANCE", "STATE", "ISOLATION", "ENGINECONNS", "TOTAL", "LEFT", "LAST_HEARTBEAT",
    ]  # fmt: skip
    assert [r.split()[:3] for r in rows] == [["agent1", "RUNNING", "cgroup-v1"]]
    assert await ctl(rm, "-o", "wide", "node", "list") == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.split()[-3:] == ["LABELS", "PROTECTED", "REGISTERED"]

    argv: tuple[str, ...] = (
        "engineconn",
        "create",
        "--user",
        "lrmtest_a",
        "--labels",
        SHELL_A,
        "-q",
    )
    assert await ctl(rm, *argv, "--param", "max_idle_seconds=300") == 0
    ec_id = capsys.readouterr().out.strip()
    assert ec_id.startswith("ec-") and "\n" not in ec_id

    # exec streams the output; the id may be abbreviated to a unique prefix.
    assert await ctl(rm, "engineconn", "exec", ec_id[:8], "id -un") == 0
    assert capsys.readouterr().out == "lrmtest_a\n"
    assert await ctl(rm, "engineconn", "exec", ec_id, "echo to-err >&2; exit 3") == 3
    assert capsys.readouterr().err == "to-err\n"
    executions_done = datetime.now(UTC)  # the in-process RM's clock is this host's

    # -o json is the protobuf JSON of GetEngineConn's EngineConn. Its state may still move:
    # the EngineConn's report of the second execution's BUSY can reach the RM after the
    # IDLE that followed the first was read. Settled means IDLE from a report that reached
    # the RM after the executions ended (reports are ordered by their arrival).
    async def shown_and_fresh() -> tuple[ec_pb.EngineConn, ec_pb.EngineConn] | None:
        assert await ctl(rm, "-o", "json", "engineconn", "status", ec_id) == 0
        shown = json_format.Parse(capsys.readouterr().out, ec_pb.EngineConn())
        fresh = await client.get_engine_conn(ec_id)
        heard_since = fresh.update_time.ToDatetime(tzinfo=UTC) > executions_done
        for ec in (shown, fresh):  # moved by the EngineConn's own heartbeats
            ec.ClearField("update_time")
        if heard_since and shown == fresh and shown.state == ec_pb.ENGINE_CONN_STATE_IDLE:
            return shown, fresh
        return None

    shown, fresh = await wait_until(shown_and_fresh, 10, what="status -o json settled on IDLE")
    assert shown == fresh and fresh.secret  # JSON: GetEngineConn's, secret included
    assert await ctl(rm, "engineconn", "status", ec_id) == 0
    text = capsys.readouterr().out
    assert fresh.secret not in text  # the detail view leaves it out
    view = details(text, head_only=True)
    assert view["engine_conn_id"] == ec_id and view["state"] == "IDLE"
    assert view["user"] == "lrmtest_a" and view["ecm"] == "agent1"
    assert "max_idle_seconds=300" in view["params"]
    assert view["ecm_choice.1"].startswith("agent1 eligible score=")
    assert "health:" in view["ecm_choice.1"] and "resource:" in view["ecm_choice.1"]

    assert await ctl(rm, "engineconn", "list") == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "ENGINE_CONN_ID", "STATE", "USER", "ENGINE", "ECM", "ADDRESS", "AGE",
    ]  # fmt: skip
    assert row.split()[:5] == [ec_id, "IDLE", "lrmtest_a", "shell-1", "agent1"]
    assert await ctl(rm, "-o", "json", "engineconn", "list") == 0
    listed = json.loads(capsys.readouterr().out)["engine_conns"]
    assert [e["engine_conn_id"] for e in listed] == [ec_id] and "secret" not in listed[0]
    assert await ctl(rm, "engineconn", "list", "--state", "failed") == 0
    assert len(capsys.readouterr().out.splitlines()) == 1  # the header only
    argv = ("--watch-interval", "0.01", "--watch-rounds", "2", "-o", "wide")
    assert await ctl(rm, *argv, "engineconn", "list", "--watch", "--user", "lrmtest_a") == 0
    header, row = capsys.readouterr().out.splitlines()  # piped: an unchanged view once
    assert header.split()[-5:] == ["RESOURCE", "PID", "TICKET", "LABELS", "REASON"]
    assert ec_id in row and "mem=256Mi" in row

    assert await ctl(rm, "node", "status", "agent") == 0  # a prefix
    text = capsys.readouterr().out
    assert (
        details(text, head_only=True)["state"] == "RUNNING"
        and details(text, head_only=True)["engineconns"] == "1"
    )
    assert ec_id in text.split("\n\n")[1]

    # The runtime logs to its stderr.log; the test runs as root, so the files are readable.
    assert await ctl(rm, "engineconn", "logs", ec_id) == 0
    out = capsys.readouterr().out
    assert "stderr.log <==" in out and "creation context: ec_id=" + ec_id in out

    # -f follows until the EngineConn has ended: kill it meanwhile.
    follow = asyncio.ensure_future(ctl(rm, "engineconn", "logs", "-f", ec_id))
    printed: list[str] = []

    async def following() -> bool:  # the follow has printed the log so far
        printed.append(capsys.readouterr().out)
        return "stderr.log <==" in "".join(printed)

    await wait_until(following, timeout=20)
    assert await ctl(rm, "engineconn", "kill", ec_id) == 0
    assert await asyncio.wait_for(follow, timeout=20) == 0
    out = "".join(printed) + capsys.readouterr().out
    assert f"{ec_id} SHUTTING_DOWN" in out
    assert "stopping" in out  # written by the EngineConn after the follow had started

    assert await ctl(rm, "engineconn", "status", ec_id) == 0
    view = details(capsys.readouterr().out, head_only=True)
    assert view["state"] in ENDED and view["ended"] != "-"
    assert await ctl(rm, "engineconn", "exec", ec_id, "true") == 1
    assert "has no executor" in capsys.readouterr().err
    assert await ctl(rm, "check") == 0


async def test_node_drain_refresh_and_errors(
    cluster_rm: Any, client: Any, agent_factory: Any, capsys: Any
) -> None:
    rm = cluster_rm
    await start_agent(rm, agent_factory)
    # The async SDK: create and execute.
    ec = await client.create_engine_conn(SHELL_A, user="lrmtest_a", timeout=30)
    items = [item async for item in client.execute(ec, "echo hi; echo ho >&2")]
    assert items == [
        ExecOutput("stdout", "hi\n"),
        ExecOutput("stderr", "ho\n"),
        ExecResult(0, False, ""),
    ]
    # The address with the secret given apart works too; without it the executor refuses.
    items = [item async for item in client.execute(ec.address, "true", secret=ec.secret)]
    assert items == [ExecResult(0, False, "")]
    with pytest.raises(Unauthenticated, match="requires its secret"):
        [item async for item in client.execute(ec.address, "true")]
    capsys.readouterr()

    # A user the agent refuses: one error line, exit 1.
    argv: tuple[str, ...] = (
        "engineconn",
        "create",
        "--labels",
        "userCreator=root-IDE,engineType=shell-1",
    )
    assert await ctl(rm, *argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: FAILED_PRECONDITION") and "refused" in err
    assert len(err.strip().splitlines()) == 1
    assert await ctl(rm, "engineconn", "status", "ec-nothing-like-it") == 1
    assert capsys.readouterr().err.startswith("error: NOT_FOUND: ")
    assert await ctl(rm, "engineconn", "create", "--user", "lrmtest_a") == 2  # no --labels
    capsys.readouterr()

    assert await ctl(rm, "node", "decommission", "agent1") == 0
    assert "agent1 DRAINING: 1 live EngineConns" in capsys.readouterr().out
    assert await ctl(rm, "node", "status", "agent1") == 0
    assert details(capsys.readouterr().out, head_only=True)["state"] == "DRAINING"
    assert await ctl(rm, "engineconn", "create", "--labels", SHELL_A) == 1  # nowhere to go
    assert capsys.readouterr().err.startswith("error: ")

    # Once its last EngineConn has ended, the draining ECM leaves.
    await client.kill_engine_conn(ec.engine_conn_id)

    async def gone() -> bool:
        return not [e for e in await client.list_ecms()]

    await wait_until(gone, timeout=20)
    assert await ctl(rm, "node", "list") == 0
    assert capsys.readouterr().out.splitlines()[1:] == []

    argv = ("node", "refresh", "--include", "agent1,agent2", "--exclude", "agent9")
    assert await ctl(rm, "-o", "json", *argv) == 0
    assert json.loads(capsys.readouterr().out) == {}  # nobody registered is disallowed
    assert await ctl(rm, *argv) == 0
    view = details(capsys.readouterr().out, head_only=True)
    assert view == {"include": "agent1,agent2", "exclude": "agent9", "disallowed": "-"}
    assert await ctl(rm, "node", "refresh") == 0  # clears both lists
    assert details(capsys.readouterr().out, head_only=True)["include"] == "(all)"
    assert await ctl(rm, "check") == 0


# --- without a cluster -----------------------------------------------------------------------


class _Client:
    """Just enough of RMClient for `engineconn logs`."""

    def __init__(self, ec: Any) -> None:
        self.ec = ec

    def get_engine_conn(self, ec_id: str) -> Any:
        return self.ec

    def list_engine_conns(self) -> list[Any]:
        return [self.ec]


def test_logs_fall_back_to_the_stored_tail(capsys: Any, tmp_path: Any) -> None:
    ec = ec_pb.EngineConn(
        engine_conn_id="ec-1",
        state=ec_pb.ENGINE_CONN_STATE_FAILED,
        ecm_instance="worker-7",
        work_dir=str(tmp_path / "elsewhere" / "ec-1"),  # not on this host
        log_tail="Traceback ...\nValueError: bad config\n",
    )
    args = argparse.Namespace(ec_id="ec-1", follow=True, output="table", tail=None, since=None)
    out = io.StringIO()
    assert cmd_ec_logs(_Client(ec), args, out) == 0  # type: ignore[arg-type]
    assert out.getvalue() == "Traceback ...\nValueError: bad config\n"
    assert "the full logs are on ECM worker-7 in " in capsys.readouterr().err

    ec.log_tail = ""
    with pytest.raises(ValueError, match="not readable from this host"):
        cmd_ec_logs(_Client(ec), args, io.StringIO())  # type: ignore[arg-type]


class _FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_create_progress_only_on_a_terminal() -> None:
    tty = _FakeTty()

    def once_shown() -> str:
        # The call ends once the spinner is on the terminal: no guess at how long that takes.
        wait_until_sync(lambda: "starting shell-1" in tty.getvalue(), 10, interval=0.01)
        return "ec-1"

    assert with_progress("starting shell-1", once_shown, tty) == "ec-1"
    assert "starting shell-1 0s" in tty.getvalue() and tty.getvalue().endswith("\r\x1b[K")
    piped = io.StringIO()
    assert with_progress("starting shell-1", lambda: "ec-1", piped) == "ec-1"
    assert piped.getvalue() == ""

    def fails() -> str:
        raise RuntimeError("no ECM")

    with pytest.raises(RuntimeError, match="no ECM"):
        with_progress("starting", fails, _FakeTty())
