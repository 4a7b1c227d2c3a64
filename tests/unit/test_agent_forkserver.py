"""The fork server's rules that need no sudo: which launches may be forked, the launch
script of a fork server, and the agent never believing a pid the server names."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ecm_agent.forkserver import (
    ForkServer,
    ForkServerError,
    ForkServers,
    forkable_argv,
    forkable_env,
)
from ecm_agent.launch import render_launch_script
from ecm_agent.validate import LaunchSpec, ValidatedLaunch
from labelrm_common import forkserver_wire as wire

PYTHON = "/opt/labelrm/ec-venv/bin/python"


def validated(program: str = "python", *argv: str, path: str = PYTHON) -> ValidatedLaunch:
    spec = LaunchSpec(ec_id="ec-1", user="alice", engine="shell", program=program, argv=argv)
    return ValidatedLaunch(spec, 1000, 1000, "/home/alice", path, {})


@pytest.mark.parametrize(
    ("launch", "expected"),
    [
        (validated("python", "-m", "engineconn", "--ec-id", "x"), ["--ec-id", "x"]),
        (validated("python", "-m", "engineconn"), []),
        # Another interpreter than the fork server's, another program, another module,
        # interpreter options, a nested fork server: all through sudo.
        (validated("python", "-m", "engineconn", path="/usr/bin/python3"), None),
        (validated("bash", "-m", "engineconn", path=PYTHON), None),
        (validated("python", "-m", "other"), None),
        (validated("python", "-I", "-m", "engineconn"), None),
        (validated("python", "-c", "import engineconn"), None),
        (validated("python", "-m", "engineconn", "--fork-server"), None),
        (validated("python"), None),
    ],
)
def test_forkable_argv(launch: ValidatedLaunch, expected: list[str] | None) -> None:
    assert forkable_argv(launch, PYTHON) == expected


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["LABELRM_EC_ID", "TMPDIR", "LABELRM_EC_SECRET", "LABELRM_TLS_KEY"], True),
        ([], True),
        # Read by an interpreter (or its libraries) when it starts: a fork would not see them.
        (["LABELRM_RM", "PYTHONPATH"], False),
        (["PYTHONHASHSEED"], False),
        (["LC_ALL"], False),
        (["HOME"], False),
        (["GRPC_VERBOSITY"], False),
        (["labelrm_x"], False),
        (["LABELRM"], False),
    ],
)
def test_forkable_env(names: list[str], expected: bool) -> None:
    assert forkable_env(dict.fromkeys(names, "v")) is expected


def test_fork_server_launch_script_keeps_stdout_for_the_agent() -> None:
    args: dict[str, Any] = {
        "work_dir": Path("/w/alice/20260101/forkserver/fs-1"),
        "program_path": PYTHON,
        "argv": ("-m", "engineconn", "--fork-server"),
        "environment": {"TMPDIR": "/w/t"},
    }
    usual = render_launch_script(**args).splitlines()
    kept = render_launch_script(**args, keep_stdout=True).splitlines()
    assert usual[-1].endswith(" >>logs/stdout.log 2>>logs/stderr.log")
    assert kept[-1] == f"exec {PYTHON} -m engineconn --fork-server 2>>logs/stderr.log"
    assert usual[:-1] == kept[:-1]


# ----- the agent believes the kernel, not the server -------------------------------------


@pytest.fixture
async def stand_in() -> AsyncIterator[ForkServer]:
    """A ForkServer object around a harmless process of ours (not a real fork server)."""
    proc = await asyncio.create_subprocess_exec(
        "sleep", "30", stdin=asyncio.subprocess.PIPE, start_new_session=True
    )
    server = ForkServer("alice", os.getuid(), sys.executable, Path("/nonexistent"), proc)
    server.pid = proc.pid
    yield server
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


async def test_a_pid_that_is_not_its_child_is_refused_and_the_server_stopped(stand_in) -> None:
    # This test process: not a child of the "server", not a session leader of its own.
    with pytest.raises(ForkServerError, match="not its child"):
        stand_in._check_child(os.getpid())
    assert stand_in.closing
    await asyncio.wait_for(stand_in.process.wait(), 10)  # killed


async def test_a_child_of_another_user_is_refused(stand_in) -> None:
    # A real child of the process, its own session, but not of the server's uid.
    stand_in.uid = os.getuid() + 1
    with pytest.raises(ForkServerError, match="not its child"):
        stand_in._check_child(stand_in.process.pid)


async def test_a_pid_already_gone_counts_as_ended(stand_in) -> None:
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    assert stand_in._check_child(gone.pid) == 0  # no start time: nothing will be signalled
    assert not stand_in.closing


async def test_answers_nobody_asked_for_are_protocol_errors(stand_in) -> None:
    with pytest.raises(TypeError):
        stand_in._dispatch(wire.Spawned("ec-1", 1234))
    with pytest.raises(TypeError):  # a second "ready"
        stand_in._dispatch(wire.Ready(1234, hold=True))
    # The exit of a pid it never launched for us is ignored, not stored.
    stand_in._dispatch(wire.Exit(4321, 0))
    assert await stand_in.exit_status(4321, within=0.01) is None


# ----- which servers the pool keeps ------------------------------------------------------


class _Stub:
    """Stands in for a ForkServer in the pool's bookkeeping."""

    def __init__(self, idle_for: float) -> None:
        import time

        self.last_used = time.monotonic() - idle_for
        self.alive = True
        self._eof = False
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.alive = False


def _pool(max_servers: int = 2, idle: float = 600.0) -> ForkServers:
    from ecm_agent.validate import AgentPolicy

    policy = AgentPolicy(
        work_root=Path("/w"),
        state_dir=Path("/s"),
        allowed_users=frozenset({"alice"}),
        programs={"python": PYTHON},
    )
    return ForkServers(
        policy,
        prepare=lambda *_: (_ for _ in ()).throw(AssertionError("no start expected")),
        argv_for=lambda *_: [],
        sudo_env={},
        lookup_user=lambda _: None,
        max_servers=max_servers,
        idle_seconds=idle,
    )


def test_idle_servers_are_closed_and_recent_ones_kept_when_slots_run_out() -> None:
    pool = _pool(max_servers=2, idle=600.0)
    idle, recent, old = _Stub(700.0), _Stub(1.0), _Stub(300.0)
    pool._servers = {("a", PYTHON): idle, ("b", PYTHON): recent}  # type: ignore[dict-item]
    pool._evict()
    assert idle.closed and not recent.closed  # idle past idle_seconds: closed
    pool._servers[("c", PYTHON)] = old  # type: ignore[assignment]
    pool._evict()  # both slots taken: the least recently used goes, if not recent
    assert old.closed and not recent.closed
    pool._servers = {("b", PYTHON): recent, ("d", PYTHON): _Stub(2.0)}  # type: ignore[dict-item]
    pool._evict()  # all recent: none is closed for a newcomer (it takes the sudo path)
    assert not any(s.closed for s in pool._servers.values())  # type: ignore[attr-defined]


async def test_nothing_forkable_or_no_slots_means_no_server() -> None:
    pool = _pool(max_servers=0)
    launch = validated("python", "-m", "engineconn")
    assert await pool.spawn(launch, Path("/w/x"), {"TMPDIR": "/w/x/tmp"}) is None
    assert not pool._starting
    pool = _pool(max_servers=2)
    bash = validated("bash", "-c", "true", path="/bin/bash")
    assert await pool.spawn(bash, Path("/w/x"), {}) is None
    assert await pool.spawn(launch, Path("/w/x"), {"PYTHONPATH": "/x"}) is None
    assert not pool._starting  # nothing forkable: no server is started for it
