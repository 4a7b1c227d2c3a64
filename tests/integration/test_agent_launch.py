"""The agent's launcher with REAL sudo, REAL users and real processes.

Needs root, sudo, and the users lrmtest_a / lrmtest_b (scripts/create_test_users.sh;
CI runs it). In CI (CI=true) a missing prerequisite fails the tests instead of
skipping them.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ecm_agent.launch import ExitInfo
from ecm_agent.procs import RunningProcess, _group_members, _signal_group, read_start_ticks
from ecm_agent.validate import AgentPolicy, LaunchRefused, LaunchSpec, MaterialFile
from tests.support.env import unavailable
from tests.support.waiting import wait_until

USER_A = "lrmtest_a"
USER_B = "lrmtest_b"
DEADLINE = 15.0


@pytest.fixture(scope="module")
def test_users() -> dict[str, int]:
    """The test users' uids; fails in CI, skips elsewhere, when they cannot be used."""

    def missing(reason: str) -> None:
        unavailable(f"{reason} (run scripts/create_test_users.sh as root)")

    if os.geteuid() != 0:
        missing("the agent tests must run as root")
    if shutil.which("sudo") is None:
        missing("sudo is not installed")
    uids: dict[str, int] = {}
    for user in (USER_A, USER_B):
        try:
            uids[user] = pwd.getpwnam(user).pw_uid
        except KeyError:
            missing(f"user {user} does not exist")
    for user in (USER_A, USER_B):
        probe = subprocess.run(
            ["sudo", "-n", "-u", user, "true"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode != 0:
            missing(f"`sudo -n -u {user} true` failed: {probe.stderr.strip()}")
    return uids


@pytest.fixture
def work_root() -> Iterator[Path]:
    # Not under pytest's tmp_path: that lives in a 0700 directory the test users
    # cannot traverse. /tmp is world-traversable.
    root = Path(tempfile.mkdtemp(prefix="lrm-agent-test-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def policy(test_users, work_root, tmp_path) -> AgentPolicy:
    return AgentPolicy(
        work_root=work_root,
        state_dir=tmp_path / "state",
        allowed_users=frozenset({USER_A, "root"}),
        programs={"bash": "/bin/bash", "python": sys.executable},
        kill_grace=3.0,
    )


def ec_spec(**over: object) -> LaunchSpec:
    base: dict[str, object] = {
        "ec_id": f"ec-{uuid.uuid4().hex[:12]}",
        "user": USER_A,
        "engine": "shell",
        "program": "bash",
        "argv": ("-c", "echo started; sleep 30"),
        "environment": {"GREETING": "hello world"},
    }
    base.update(over)
    return LaunchSpec(**base)  # type: ignore[arg-type]


def group_pids(pgid: int) -> list[int]:
    """Every live process whose process group is ``pgid``. Zombies are dead: an
    orphan's zombie waits for PID 1, which in some containers reaps lazily."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry))
    return pids


def uids_of(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError("no Uid line")


def user_processes(pgid: int, uid: int) -> list[int]:
    found = []
    for pid in group_pids(pgid):
        try:
            if uids_of(pid)[0] == uid:
                found.append(pid)
        except (OSError, AssertionError):
            pass
    return found


def processes_with_ec_id(ec_id: str) -> list[int]:
    """Processes anywhere on the host whose environment names this EngineConn."""
    needle = f"LABELRM_EC_ID={ec_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found.append(int(entry))
    return found


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def exists(path: str) -> bool:
    return os.path.exists(path)


def proc_strings(pid: int, name: str) -> list[str]:
    """/proc/<pid>/environ or cmdline as a list of strings."""
    return Path(f"/proc/{pid}/{name}").read_bytes().decode().split("\0")[:-1]


# ----- launch, identity, kill ----------------------------------------------------------


async def test_launch_runs_as_the_user_and_kill_stops_the_group(make_launcher, test_users, policy):
    launcher = make_launcher()
    uid = test_users[USER_A]
    proc = await launcher.launch(ec_spec())
    assert proc.pgid == proc.pid and proc.start_ticks == read_start_ticks(proc.pid)
    stdout = proc.work_dir / "logs" / "stdout.log"
    await wait_until(
        lambda: "started" in read(stdout), timeout=DEADLINE, what="stdout.log says started"
    )

    # The EngineConn's own processes (children of sudo) run as the user, all four uids.
    await wait_until(
        lambda: user_processes(proc.pgid, uid),
        timeout=DEADLINE,
        what="a process of the user in the group",
    )
    for pid in user_processes(proc.pgid, uid):
        assert uids_of(pid) == [uid] * 4
    assert uids_of(proc.pid)[0] == 0  # sudo itself

    # Layout and ownership of the work directory.
    wd = proc.work_dir
    assert wd.parent.parent.parent.parent == policy.work_root  # mkdtemp gave a real path
    user_dir = wd.parent.parent.parent
    assert (user_dir.stat().st_uid, user_dir.stat().st_mode & 0o777) == (uid, 0o750)
    assert (wd.parent.stat().st_uid, wd.parent.stat().st_mode & 0o777) == (0, 0o755)
    for path in (wd, wd / "logs", wd / "tmp", wd / "logs" / "stdout.log"):
        assert path.stat().st_uid == uid, path
    script = wd / "launch.sh"
    assert (script.stat().st_uid, script.stat().st_mode & 0o777) == (0, 0o644)

    state = json.loads((policy.state_dir / f"{proc.ec_id}.json").read_text())
    assert state["pid"] == proc.pid and state["start_ticks"] == proc.start_ticks
    assert state["user"] == USER_A and state["work_dir"] == str(wd)
    assert launcher.running() == {proc.ec_id: proc}

    await launcher.kill(proc.ec_id)
    await wait_until(
        lambda: not group_pids(proc.pgid), timeout=DEADLINE, what="the whole process group is gone"
    )
    info = await asyncio.wait_for(launcher.wait_exit(proc.ec_id), DEADLINE)
    assert info.exit_code == -signal.SIGTERM
    assert launcher.running() == {}
    await launcher.kill(proc.ec_id)  # already gone: no error
    launcher.forget(proc.ec_id)
    assert not (policy.state_dir / f"{proc.ec_id}.json").exists()


async def test_kill_escalates_to_sigkill_after_grace(make_launcher):
    launcher = make_launcher()
    proc = await launcher.launch(
        ec_spec(argv=("-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"))
    )
    await wait_until(
        lambda: "ready" in read(proc.work_dir / "logs" / "stdout.log"),
        timeout=DEADLINE,
        what="trap installed",
    )
    started = time.monotonic()
    await launcher.kill(proc.ec_id, grace=0.5)
    assert not _group_members(proc)
    assert time.monotonic() - started >= 0.5
    await wait_until(
        lambda: not group_pids(proc.pgid), timeout=DEADLINE, what="the group is gone after SIGKILL"
    )


async def test_exit_3_reports_code_and_stderr_tail(make_launcher):
    launcher = make_launcher()
    script = "for i in $(seq 1 30); do echo line$i >&2; done; echo out; exit 3"
    proc = await launcher.launch(ec_spec(argv=("-c", script)))
    info = await asyncio.wait_for(launcher.wait_exit(proc.ec_id), DEADLINE)
    assert info.exit_code == 3
    lines = info.log_tail.splitlines()
    assert lines == [f"line{i}" for i in range(11, 31)]
    assert launcher.log_tail(proc.ec_id, lines=2) == "line29\nline30"
    assert launcher.running() == {}


async def test_material_files_and_environment(make_launcher, test_users):
    launcher = make_launcher()
    files = (
        MaterialFile("run.sh", b'#!/bin/bash\necho from-material "$GREETING" $JAVA_X\n', True),
        MaterialFile("conf.txt", b"k=v\n"),
    )
    proc = await launcher.launch(
        ec_spec(argv=("-c", "./run.sh; cat conf.txt"), material_files=files)
    )
    info = await asyncio.wait_for(launcher.wait_exit(proc.ec_id), DEADLINE)
    assert info.exit_code == 0
    assert read(proc.work_dir / "logs" / "stdout.log") == "from-material hello world\nk=v\n"
    uid = test_users[USER_A]
    st_run, st_conf = (proc.work_dir / "run.sh").stat(), (proc.work_dir / "conf.txt").stat()
    assert (st_run.st_uid, st_run.st_mode & 0o777) == (uid, 0o700)
    assert (st_conf.st_uid, st_conf.st_mode & 0o777) == (uid, 0o600)


# ----- refusals and injection ----------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"user": "root"}, "user"),
        ({"user": "../x"}, "user"),
        ({"user": "a;b"}, "user"),
        ({"user": USER_B}, "user"),  # exists, but not in the allowed list
        ({"environment": {"LD_PRELOAD": "/tmp/evil.so"}}, "environment[LD_PRELOAD]"),
        ({"material_files": (MaterialFile("../../etc/x", b"x"),)}, "material_files[0].name"),
        ({"argv": ("-c", "true", "a\ntouch /tmp/pwned")}, "argv[2]"),
        ({"program": "/bin/sh"}, "program"),
        ({"engine": "../x"}, "engine"),
        ({"ec_id": ".."}, "ec_id"),
    ],
)
async def test_refused_launches_start_nothing(make_launcher, policy, over, field):
    launcher = make_launcher()
    spec = ec_spec(**over)
    before = set(policy.work_root.rglob("*"))
    with pytest.raises(LaunchRefused) as info:
        await launcher.launch(spec)
    assert info.value.field == field
    assert launcher.running() == {}
    assert not policy.state_dir.exists() or not any(policy.state_dir.iterdir())
    assert set(policy.work_root.rglob("*")) == before
    if isinstance(spec.ec_id, str) and spec.ec_id not in (".", ".."):
        assert processes_with_ec_id(spec.ec_id) == []


async def test_shell_syntax_in_values_is_inert(make_launcher, test_users):
    launcher = make_launcher()
    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    pre_existing = exists("/tmp/pwned")
    env = {
        "P1": "$(touch /tmp/pwned)",
        "P2": f"$(touch {marker})",
        "P3": f"`touch {marker}`",
        "P4": f"'; touch {marker}; '",
        "P5": f"line1\n$(touch {marker})\nline3",
    }
    argv = ("-c", "sleep 30; true", f"$(touch {marker})")
    proc = await launcher.launch(ec_spec(argv=argv, environment=env))
    uid = test_users[USER_A]

    def the_bash() -> int | None:
        for pid in user_processes(proc.pgid, uid):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "bash":
                return pid
        return None

    await wait_until(the_bash, timeout=DEADLINE, what="the user's bash is running")
    pid = the_bash()
    assert pid is not None
    environ = dict(item.split("=", 1) for item in proc_strings(pid, "environ"))
    for name, value in env.items():
        assert environ[name] == value
    assert environ["LABELRM_EC_ID"] == proc.ec_id
    assert environ["TMPDIR"] == str(proc.work_dir / "tmp")
    assert environ["HOME"] == pwd.getpwnam(USER_A).pw_dir
    cmdline = proc_strings(pid, "cmdline")
    assert cmdline == ["/bin/bash", *argv]
    assert not exists(marker)
    assert exists("/tmp/pwned") == pre_existing
    await launcher.kill(proc.ec_id, grace=2)


async def test_symlinked_user_dir_is_refused(make_launcher, policy, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    policy.work_root.mkdir(parents=True, exist_ok=True)
    (policy.work_root / USER_A).symlink_to(elsewhere)
    launcher = make_launcher()
    spec = ec_spec()
    with pytest.raises(LaunchRefused) as info:
        await launcher.launch(spec)
    assert info.value.field == "work_dir"
    assert list(elsewhere.iterdir()) == []
    assert launcher.running() == {} and not any(policy.state_dir.glob("*"))
    assert processes_with_ec_id(spec.ec_id) == []


async def test_symlinked_engine_dir_is_refused(make_launcher, policy, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    launcher = make_launcher()
    first = await launcher.launch(ec_spec(argv=("-c", "true")))
    await launcher.wait_exit(first.ec_id)
    engine_dir = first.work_dir.parent
    shutil.rmtree(engine_dir)
    engine_dir.symlink_to(elsewhere)
    with pytest.raises(LaunchRefused) as info:
        await launcher.launch(ec_spec())
    assert info.value.field == "work_dir"
    assert list(elsewhere.iterdir()) == []


async def test_same_ec_id_twice_is_refused(make_launcher):
    launcher = make_launcher()
    spec = ec_spec(argv=("-c", "true"))
    proc = await launcher.launch(spec)
    await launcher.wait_exit(proc.ec_id)
    with pytest.raises(LaunchRefused) as info:
        await launcher.launch(spec)
    assert info.value.field == "ec_id"
    launcher.forget(proc.ec_id)
    with pytest.raises(LaunchRefused) as info:  # its work directory still exists
        await make_launcher().launch(spec)
    assert info.value.field == "ec_id"


async def test_log_tail_does_not_follow_a_users_symlink(make_launcher, tmp_path):
    launcher = make_launcher()
    proc = await launcher.launch(ec_spec(argv=("-c", "echo visible >&2; exit 1")))
    assert (await launcher.wait_exit(proc.ec_id)).log_tail == "visible"
    secret = tmp_path / "secret"
    secret.write_text("root-only secret\n")
    secret.chmod(0o600)
    stderr = proc.work_dir / "logs" / "stderr.log"
    stderr.unlink()
    stderr.symlink_to(secret)
    assert "secret" not in launcher.log_tail(proc.ec_id)
    stderr.unlink()
    os.link(secret, stderr)  # a hard link (root can make one): not the user's file
    assert "secret" not in launcher.log_tail(proc.ec_id)


# ----- re-attach -----------------------------------------------------------------------


async def test_reattach_after_restart_then_kill(make_launcher, policy):
    first = make_launcher()
    proc = await first.launch(ec_spec(argv=("-c", "echo started; sleep 30; true")))
    await wait_until(
        lambda: "started" in read(proc.work_dir / "logs" / "stdout.log"),
        timeout=DEADLINE,
        what="started",
    )

    second = make_launcher()  # "the agent restarted": same state dir, nothing in memory
    assert second.running() == {}
    found = second.reattach()
    assert found == [proc]
    assert second.running() == {proc.ec_id: proc}
    assert _group_members(proc)  # re-attaching killed nothing

    waiter = asyncio.create_task(second.wait_exit(proc.ec_id))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await second.kill(proc.ec_id, grace=2)
    info = await asyncio.wait_for(waiter, DEADLINE)
    assert info.exit_code is None  # not our child: the code is unknowable
    assert "started" in info.log_tail  # stderr is empty: stdout's tail
    await wait_until(lambda: not group_pids(proc.pgid), timeout=DEADLINE, what="the group is gone")
    assert second.running() == {}

    # A third start finds the state file of a dead process and drops it.
    third = make_launcher()
    assert third.reattach() == []
    assert not (policy.state_dir / f"{proc.ec_id}.json").exists()


async def test_state_file_with_reused_pid_is_dropped_and_not_killed(make_launcher, policy):
    bystander = await asyncio.create_subprocess_exec("sleep", "30", start_new_session=True)
    try:
        ticks = read_start_ticks(bystander.pid)
        assert ticks is not None
        policy.state_dir.mkdir(parents=True, exist_ok=True)
        fake = {
            "ec_id": "ec-reused",
            "pid": bystander.pid,
            "pgid": bystander.pid,
            "start_ticks": ticks - 1,  # the pid was reused by a later process
            "user": USER_A,
            "uid": pwd.getpwnam(USER_A).pw_uid,
            "work_dir": str(policy.work_root / "x"),
            "engine": "shell",
        }
        (policy.state_dir / "ec-reused.json").write_text(json.dumps(fake))
        (policy.state_dir / "garbage.json").write_text("{not json")
        launcher = make_launcher()
        assert launcher.reattach() == []
        assert sorted(p.name for p in policy.state_dir.iterdir()) == []
        await launcher.kill("ec-reused", grace=0.1)  # unknown now: does nothing
        stale = RunningProcess(
            "ec-reused", bystander.pid, bystander.pid, ticks - 1, USER_A, policy.work_root
        )
        assert _signal_group(stale, signal.SIGKILL) is False  # the guard itself
        await asyncio.sleep(0.2)
        assert bystander.returncode is None
        assert read_start_ticks(bystander.pid) == ticks
    finally:
        bystander.kill()
        await bystander.wait()


async def test_reattached_wait_falls_back_to_polling_without_pidfd(make_launcher, monkeypatch):
    first = make_launcher()
    proc = await first.launch(ec_spec(argv=("-c", "echo bye >&2; sleep 0.5; exit 4")))
    second = make_launcher()
    assert second.reattach() == [proc]

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(38, "pidfd_open not available")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    info = await asyncio.wait_for(second.wait_exit(proc.ec_id), DEADLINE)
    assert info == ExitInfo(None, "bye")
    assert (await first.wait_exit(proc.ec_id)).exit_code == 4  # the parent knows the code
