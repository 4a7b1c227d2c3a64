"""Fork servers with REAL sudo, REAL users, the installed EngineConn runtime and real
EngineConns reporting to a stand-in RM: a user's launches after the first are forks of
a warm interpreter, with every property of a launch through sudo.

Needs root and the test users (scripts/create_test_users.sh); CI=true fails instead of
skipping (the `sudo_users` / `ec_python` fixtures of tests/fixtures/agents.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import executor_pb2, executor_pb2_grpc

from ecm_agent.forkserver import ForkServer
from ecm_agent.launch import Launcher
from ecm_agent.procs import RunningProcess, _group_members
from ecm_agent.validate import AgentPolicy, LaunchSpec
from tests.support.env import shared_tmp
from tests.support.fake_rm import FakeRM
from tests.support.waiting import wait_until

USER_A = "lrmtest_a"
USER_B = "lrmtest_b"
DEADLINE = 60.0  # a poll deadline: a cold first launch on a loaded machine takes seconds
IDLE = ec_pb.ENGINE_CONN_STATE_IDLE
SUCCEEDED = ec_pb.ENGINE_CONN_STATE_SUCCEEDED


@pytest.fixture
def policy(sudo_users, ec_python, tmp_path) -> Iterator[AgentPolicy]:
    root = shared_tmp("lrm-forkserver-test-")
    yield AgentPolicy(
        work_root=root,
        state_dir=tmp_path / "state",
        allowed_users=frozenset({USER_A, USER_B}),
        programs={"bash": "/bin/bash", "python": ec_python},
        kill_grace=3.0,
    )
    import shutil

    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def launcher_fork_servers() -> int:
    return 4


def ec_spec(rm: FakeRM, user: str = USER_A, *extra: str, **over: Any) -> LaunchSpec:
    ec_id = f"ec-{uuid.uuid4().hex[:12]}"
    base: dict[str, Any] = {
        "ec_id": ec_id,
        "user": user,
        "engine": "shell",
        "program": "python",
        "argv": ("-m", "engineconn", "--ec-id", ec_id, "--engine", "shell", *extra),
        "environment": {"LABELRM_EC_SECRET": secrets.token_urlsafe(32), "LABELRM_RM": rm.target},
    }
    base.update(over)
    return LaunchSpec(**base)


def exists(path: str) -> bool:
    return os.path.exists(path)


def proc_title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()


async def title_when_set(pid: int, prefix: str) -> str:
    """The process title once it starts with `prefix` (the fork sets its title just
    after the server has answered with its pid)."""
    title: str = await wait_until(
        lambda: (now := proc_title(pid)).startswith(prefix) and now,
        DEADLINE,
        what=lambda: f"title of {pid} starting {prefix!r}: {proc_title(pid)!r}",
        interval=0.02,
    )
    return title


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def stat_of(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # [0] state, [1] ppid, [2] pgrp, [3] session


async def warm(launcher: Launcher, rm: FakeRM, user: str = USER_A) -> ForkServer:
    """A first launch (through sudo) starts the user's fork server; wait until it is ready."""
    first = ec_spec(rm, user)
    proc = await launcher.launch(first)
    assert int(status_of(proc.pid)["Uid"].split()[0]) == 0  # sudo: no server was ready yet
    servers: list[ForkServer] = await wait_until(
        lambda: [s for (u, _), s in launcher.forks.servers().items() if u == user],
        timeout=DEADLINE,
        what=f"the fork server of {user} is ready",
    )
    await wait_until(
        lambda: rm.report(first.ec_id, IDLE), timeout=DEADLINE, what="the first EngineConn is ready"
    )
    return servers[0]


async def execute(address: str, secret: str, code: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        out = []
        async for event in stub.Execute(
            executor_pb2.ExecuteRequest(code=code),
            metadata=(("authorization", f"Bearer {secret}"),),
            timeout=DEADLINE,
        ):
            if event.HasField("output"):
                out.append(event.output.text)
        return "".join(out)


# ----- the forked launch is a launch like any other -----------------------------------


async def test_forked_engineconn_is_the_users_in_its_own_session(
    make_launcher, fake_rm, policy
) -> None:
    launcher = make_launcher()
    server = await warm(launcher, fake_rm)
    import pwd

    entry = pwd.getpwnam(USER_A)
    assert set(status_of(server.pid)["Uid"].split()) == {str(entry.pw_uid)}

    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    spec = ec_spec(fake_rm)
    spec = LaunchSpec(
        **{
            **spec.__dict__,
            "environment": {**spec.environment, "LABELRM_NOTE": f"$(touch {marker}) `x` ';"},
        }
    )
    proc = await launcher.launch(spec)
    # A fork of the server: the user's (all four uids), own session and process group.
    _state, ppid, pgrp, session = stat_of(proc.pid)[:4]
    assert int(ppid) == server.pid
    assert int(pgrp) == int(session) == proc.pid == proc.pgid
    assert set(status_of(proc.pid)["Uid"].split()) == {str(entry.pw_uid)}
    assert status_of(proc.pid)["Umask"] == "0027"
    # `ps` shows which EngineConn it is, not the server's command line.
    cmdline = await title_when_set(proc.pid, "engineconn")
    assert cmdline.startswith(f"engineconn --ec-id {spec.ec_id}")
    assert os.readlink(f"/proc/{proc.pid}/cwd") == str(proc.work_dir)
    assert os.readlink(f"/proc/{proc.pid}/fd/0") == "/dev/null"
    logs = proc.work_dir / "logs"
    assert os.readlink(f"/proc/{proc.pid}/fd/1") == str(logs / "stdout.log")
    assert os.readlink(f"/proc/{proc.pid}/fd/2") == str(logs / "stderr.log")
    # The state file is written as for any launch: a restarted agent re-attaches it.
    saved = json.loads((policy.state_dir / f"{spec.ec_id}.json").read_text())
    assert (saved["pid"], saved["pgid"], saved["start_ticks"]) == (
        proc.pid,
        proc.pid,
        proc.start_ticks,
    )
    assert launcher.running()[spec.ec_id] == proc

    ready = await wait_until(
        lambda: fake_rm.report(spec.ec_id, IDLE), timeout=DEADLINE, what="the forked one is ready"
    )
    secret = spec.environment["LABELRM_EC_SECRET"]
    out = await execute(
        ready.address,
        secret,
        'echo "$LABELRM_EC_ID|$TMPDIR|$LABELRM_NOTE|${LABELRM_EC_SECRET:-gone}|$HOME|$PWD"; '
        "id -un; umask",
    )
    env_line, user, umask = out.strip().splitlines()
    note = f"$(touch {marker}) `x` ';"
    assert env_line.split("|") == [
        spec.ec_id,
        str(proc.work_dir / "tmp"),
        note,
        "gone",  # the runtime drops the secret before running any code
        entry.pw_dir,
        str(proc.work_dir),
    ]
    assert (user, umask) == (USER_A, "0027")
    assert not exists(marker)
    assert "creation context" in (logs / "stderr.log").read_text()

    # Kill: TERM to its group; it reports SUCCEEDED and the fork server gives its code.
    await launcher.kill(spec.ec_id)
    info = await asyncio.wait_for(launcher.wait_exit(spec.ec_id), DEADLINE)
    assert info.exit_code == 0
    assert fake_rm.report(spec.ec_id, SUCCEEDED)
    assert not _group_members(proc)


async def test_exit_codes_and_log_tails_come_back(make_launcher, fake_rm) -> None:
    launcher = make_launcher()
    await warm(launcher, fake_rm)
    bad = await launcher.launch(ec_spec(fake_rm, USER_A, "--no-such-flag"))
    info = await asyncio.wait_for(launcher.wait_exit(bad.ec_id), DEADLINE)
    assert info.exit_code == 2 and "unrecognized arguments: --no-such-flag" in info.log_tail
    version = await launcher.launch(ec_spec(fake_rm, USER_A, "--version"))
    info = await asyncio.wait_for(launcher.wait_exit(version.ec_id), DEADLINE)
    assert info.exit_code == 0
    assert (version.work_dir / "logs" / "stdout.log").read_text().startswith("engineconn ")
    # A kill -9 of the EngineConn: the code of the signal, as through sudo.
    killed = await launcher.launch(ec_spec(fake_rm))
    await wait_until(lambda: fake_rm.report(killed.ec_id, IDLE), timeout=DEADLINE, what="ready")
    os.kill(killed.pid, signal.SIGKILL)
    info = await asyncio.wait_for(launcher.wait_exit(killed.ec_id), DEADLINE)
    assert info.exit_code == -signal.SIGKILL


async def test_what_is_not_forkable_goes_through_sudo(make_launcher, fake_rm) -> None:
    launcher = make_launcher()
    await warm(launcher, fake_rm)

    def through_sudo(proc: RunningProcess) -> bool:
        return launcher._tracked[proc.ec_id].child is not None  # sudo: the agent's child

    # A variable an interpreter reads at start-up: a fresh one must see it.
    spec = ec_spec(fake_rm)
    pythonpath = LaunchSpec(
        **{**spec.__dict__, "environment": {**spec.environment, "PYTHONPATH": "/nonexistent"}}
    )
    assert through_sudo(await launcher.launch(pythonpath))
    # Another program, or python running something else than the runtime.
    bash = LaunchSpec(ec_id=f"ec-{uuid.uuid4().hex[:12]}", user=USER_A, engine="shell",
                      program="bash", argv=("-c", "sleep 5"))  # fmt: skip
    assert through_sudo(await launcher.launch(bash))
    other = LaunchSpec(ec_id=f"ec-{uuid.uuid4().hex[:12]}", user=USER_A, engine="shell",
                       program="python", argv=("-c", "import time; time.sleep(5)"))  # fmt: skip
    assert through_sudo(await launcher.launch(other))
    # Another user: never from lrmtest_a's server (lrmtest_b gets one of its own).
    assert through_sudo(await launcher.launch(ec_spec(fake_rm, USER_B)))
    forked = await launcher.launch(ec_spec(fake_rm))
    assert not through_sudo(forked)


async def test_each_user_has_their_own_server(make_launcher, fake_rm) -> None:
    import pwd

    launcher = make_launcher()
    server_a = await warm(launcher, fake_rm, USER_A)
    server_b = await warm(launcher, fake_rm, USER_B)
    assert server_a.pid != server_b.pid
    for user, server in ((USER_A, server_a), (USER_B, server_b)):
        proc = await launcher.launch(ec_spec(fake_rm, user))
        assert int(stat_of(proc.pid)[1]) == server.pid
        uid = pwd.getpwnam(user).pw_uid
        assert set(status_of(proc.pid)["Uid"].split()) == {str(uid)}


# ----- the agent and the server come and go; EngineConns stay --------------------------


async def test_agent_restart_reattaches_forked_engineconns(make_launcher, fake_rm) -> None:
    first = make_launcher()
    await warm(first, fake_rm)
    spec = ec_spec(fake_rm)
    proc = await first.launch(spec)
    await wait_until(lambda: fake_rm.report(spec.ec_id, IDLE), timeout=DEADLINE, what="ready")
    await first.close()  # the agent stops: its servers take no more launches

    second = make_launcher()  # "restarted": same state dir, nothing in memory
    assert proc in second.reattach()
    assert spec.ec_id in second.running()
    await second.kill(spec.ec_id)
    info = await asyncio.wait_for(second.wait_exit(spec.ec_id), DEADLINE)
    assert info.exit_code is None  # not its child, nor its server's: unknowable
    assert fake_rm.report(spec.ec_id, SUCCEEDED)


async def test_a_dead_server_leaves_its_engineconns_running(make_launcher, fake_rm) -> None:
    launcher = make_launcher()
    server = await warm(launcher, fake_rm)
    spec = ec_spec(fake_rm)
    proc = await launcher.launch(spec)
    await wait_until(lambda: fake_rm.report(spec.ec_id, IDLE), timeout=DEADLINE, what="ready")
    server.kill()  # SIGKILL to sudo and the server
    await wait_until(
        lambda: not launcher.forks.servers(), timeout=DEADLINE, what="the agent noticed"
    )
    await asyncio.sleep(0.3)
    assert _group_members(proc) and spec.ec_id in launcher.running()
    # The next launch goes through sudo (and starts a new server for the one after).
    again = await launcher.launch(ec_spec(fake_rm))
    assert int(status_of(again.pid)["Uid"].split()[0]) == 0
    await launcher.kill(spec.ec_id)
    info = await asyncio.wait_for(launcher.wait_exit(spec.ec_id), DEADLINE)
    assert info.exit_code is None  # its parent is gone: the code is lost, the exit is not
    assert not _group_members(proc)


async def test_a_closed_server_exits_after_its_last_engineconn(make_launcher, fake_rm) -> None:
    launcher = make_launcher()
    server = await warm(launcher, fake_rm)
    spec = ec_spec(fake_rm)
    proc = await launcher.launch(spec)
    await wait_until(lambda: fake_rm.report(spec.ec_id, IDLE), timeout=DEADLINE, what="ready")
    launcher.forks.idle_seconds = 0.0  # everything is idle now
    launcher.forks._evict()
    assert not launcher.forks.servers()
    await asyncio.sleep(0.5)
    assert server.process.returncode is None  # still reaping its EngineConn
    await launcher.kill(spec.ec_id)
    info = await asyncio.wait_for(launcher.wait_exit(spec.ec_id), DEADLINE)
    assert info.exit_code == 0  # still known: the closed server reaped it
    await asyncio.wait_for(server.process.wait(), DEADLINE)
    assert not _group_members(proc)


async def test_a_server_that_cannot_start_means_sudo(make_launcher, fake_rm, policy) -> None:
    from tests.support.env import shared_tmp as tmp

    script = tmp("lrm-fake-python-") / "python"
    script.write_text("#!/bin/bash\necho 'no runtime here' >&2\nexit 3\n")
    script.chmod(0o755)
    broken = AgentPolicy(
        work_root=policy.work_root,
        state_dir=policy.state_dir,
        allowed_users=policy.allowed_users,
        programs={"python": str(script)},
    )
    launcher = Launcher(broken, fork_servers=2)
    try:
        for _ in range(3):
            proc = await launcher.launch(ec_spec(fake_rm))
            assert launcher._tracked[proc.ec_id].child is not None  # sudo: our own child
            assert (await asyncio.wait_for(launcher.wait_exit(proc.ec_id), DEADLINE)).exit_code == 3
            # The server the first launch asked for has failed to start by now.
            await wait_until(lambda: launcher.forks.starting() == 0, timeout=DEADLINE)
        assert not launcher.forks.servers()
        assert launcher.forks.backing_off(USER_A)  # and it does not try again for a while
    finally:
        await launcher.close()
        import shutil

        shutil.rmtree(script.parent, ignore_errors=True)


# ----- the server's own protocol ------------------------------------------------------


async def test_fork_server_protocol(sudo_users, ec_python, policy) -> None:
    """Straight to `python -m engineconn --fork-server` as the user: answers, refusals,
    exits, held children (run on "go", never without it), and the end of stdin."""
    import pwd

    entry = pwd.getpwnam(USER_A)
    policy.work_root.mkdir(parents=True, exist_ok=True)
    work = policy.work_root / "ec-proto"
    for sub in ("", "logs", "tmp"):
        (work / sub).mkdir(exist_ok=True)
        os.chown(work / sub, entry.pw_uid, entry.pw_gid)
    proc = await asyncio.create_subprocess_exec(
        "sudo", "-n", "-u", USER_A, "-H", "--", ec_python, "-m", "engineconn", "--fork-server",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=str(work),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    exits: dict[int, int] = {}
    server_pid = 0

    async def answer() -> dict[str, Any]:
        """The next line that is not an exit report (those are kept in `exits`)."""
        while True:
            message = json.loads(await asyncio.wait_for(stdout.readline(), 30))
            if "exit" not in message:
                return message  # type: ignore[no-any-return]
            exits[message["exit"]] = os.waitstatus_to_exitcode(message["status"])

    async def ask(request: object) -> dict[str, Any]:
        line = request if isinstance(request, bytes) else json.dumps(request).encode()
        stdin.write(line + b"\n")
        await stdin.drain()
        return await answer()

    try:
        ready = await answer()
        server_pid = ready["ready"]
        assert ready["hold"] is True  # it can hold a child for the agent's cgroup move
        assert set(status_of(server_pid)["Uid"].split()) == {str(entry.pw_uid)}
        assert (await ask(b"not json"))["failed"] == ""
        assert (await ask({"spawn": "ec-x", "cwd": str(work)}))["failed"] == ""
        missing = await ask({"spawn": "ec-x", "cwd": "/nonexistent", "argv": [], "env": {}})
        assert missing["failed"] == "ec-x" and "FileNotFoundError" in missing["error"]
        env = {"LABELRM_EC_ID": "ec-v", "TMPDIR": str(work / "tmp")}
        version = {"cwd": str(work), "argv": ["--version"], "env": env}
        held = await ask({"spawn": "ec-h", **version, "hold": True})
        spawned = await ask({"spawn": "ec-v", **version})
        assert spawned["spawned"] == "ec-v" and held["spawned"] == "ec-h"
        while spawned["pid"] not in exits:  # the same work, not held, has run and ended
            await answer_or_exit(stdout, exits)
        assert held["pid"] not in exits and status_of(held["pid"])["State"].startswith("S")
        stdin.write(json.dumps({"go": held["pid"]}).encode() + b"\n")
        while held["pid"] not in exits:
            await answer_or_exit(stdout, exits)
        never = await ask({"spawn": "ec-n", **version, "hold": True})
        proc.stdin.close()  # the agent went away: it exits once its children are reaped
        while line := await asyncio.wait_for(proc.stdout.readline(), 30):
            message = json.loads(line)
            exits[message["exit"]] = os.waitstatus_to_exitcode(message["status"])
        assert exits[spawned["pid"]] == exits[held["pid"]] == 0
        assert exits[never["pid"]] == 127  # never released: none of it ran
        # the failed set-up, the --version (not held, held and released), the never released
        assert sorted(exits.values()) == [0, 0, 127, 127]
        assert (work / "logs" / "stdout.log").read_text().count("engineconn ") == 2
        assert (work / "logs" / "stdout.log").read_text().startswith("engineconn ")
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            if server_pid:
                os.kill(server_pid, signal.SIGKILL)  # it holds the pipes wait() waits for
            proc.kill()
            await proc.wait()


async def answer_or_exit(stdout: asyncio.StreamReader, exits: dict[int, int]) -> None:
    """Reads one line of a fork server, which must be an exit report, into `exits`."""
    message = json.loads(await asyncio.wait_for(stdout.readline(), 30))
    exits[message["exit"]] = os.waitstatus_to_exitcode(message["status"])


async def test_a_stopped_server_costs_one_launch_then_sudo(make_launcher, fake_rm) -> None:
    """The server is the user's: the user can stop it. A launch then waits a bounded
    time, fails, and the user's launches go through sudo for a while."""
    from ecm_agent.forkserver import SPAWN_TIMEOUT_SECONDS, ForkServerError

    launcher = make_launcher()
    server = await warm(launcher, fake_rm)
    os.kill(server.pid, signal.SIGSTOP)
    with pytest.raises(ForkServerError):  # not hanging: the deadline only bounds the wait
        await asyncio.wait_for(launcher.launch(ec_spec(fake_rm)), SPAWN_TIMEOUT_SECONDS + DEADLINE)
    await asyncio.wait_for(server.process.wait(), DEADLINE)  # the agent killed it
    after = await launcher.launch(ec_spec(fake_rm))
    assert launcher._tracked[after.ec_id].child is not None  # sudo
    # Backing off: no server, none being started, none to be started for a while.
    assert launcher.forks.backing_off(USER_A)
    assert not launcher.forks.servers() and launcher.forks.starting() == 0
