"""Launching EngineConns as their user: work directory, launch script, sudo, kill.

The agent runs as root and works inside directories the user owns, so every
file-system step that follows a path the user could have changed is done
relative to directory file descriptors opened with ``O_NOFOLLOW``: a user who
swaps a directory for a symlink between two steps cannot make root write, chown,
read or delete anything outside the work root.

Processes are started as ``sudo -n -u USER -H -- /bin/bash <workdir>/launch.sh``
in a new session, so sudo and everything the EngineConn starts share one process
group whose id is sudo's pid. Each launch is recorded in ``<state_dir>/<ec_id>.json``
(pid, pgid and the start time from ``/proc/<pid>/stat``) so that a restarted agent
re-attaches instead of killing, and never signals a process that merely reuses
an old pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ecm_agent.forkserver import ForkServer, ForkServers
from ecm_agent.validate import (
    AgentPolicy,
    LaunchRefused,
    LaunchSpec,
    UserLookup,
    ValidatedLaunch,
    default_pwd_lookup,
    validate_launch,
)
from ecm_agent.workdir import (
    LAUNCH_SCRIPT,
    PreparedWorkDir,
    launch_environment,
    prepare_work_dir,
    read_tail,
    render_launch_script,
    tail_text,
    work_dir_for,
)

__all__ = [
    "LAUNCH_SCRIPT",
    "ExitInfo",
    "Launcher",
    "PreparedWorkDir",
    "RunningProcess",
    "launch_environment",
    "prepare_work_dir",
    "read_start_ticks",
    "render_launch_script",
    "work_dir_for",
]

log = logging.getLogger(__name__)

BASH = "/bin/bash"
#: sudo gets no environment from the agent: whatever it passes on must be harmless.
SUDO_ENV: Mapping[str, str] = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_POLL_SECONDS = 0.05
_REAP_WAIT_SECONDS = 0.02
_REATTACHED_POLL_SECONDS = 0.2
#: After SIGKILL the kernel tears the group down quickly; this only bounds the wait.
_AFTER_KILL_SECONDS = 5.0


@dataclass(frozen=True)
class RunningProcess:
    """An EngineConn process the agent launched (or re-attached to)."""

    ec_id: str
    pid: int
    pgid: int
    start_ticks: int
    user: str
    work_dir: Path
    # The EngineConn's own process when `pid` is sudo's (0: `pid` is the EngineConn).
    main_pid: int = 0

    @property
    def engine_conn_pid(self) -> int:
        """The pid the EngineConn runs as (what the RM reports); `pid` stays the one
        the agent waits on and whose group it signals."""
        return self.main_pid or self.pid


@dataclass(frozen=True)
class ExitInfo:
    """How an EngineConn ended. ``exit_code`` is None when it is not knowable
    (re-attached processes are not our children); a negative code -N means it
    was killed by signal N (sudo re-raises the command's signal on itself)."""

    exit_code: int | None
    log_tail: str


# ----- pure parts ------------------------------------------------------------------------


def launch_argv(user: str, uid: int, script: Path, agent_uid: int | None = None) -> list[str]:
    """The command that runs the launch script as `user`: through sudo, except for an
    unprivileged agent launching as itself (dev mode), which needs no sudo rule."""
    me = os.geteuid() if agent_uid is None else agent_uid
    if me != 0 and uid == me:
        return [BASH, str(script)]
    return ["sudo", "-n", "-u", user, "-H", "--", BASH, str(script)]


def _parse_stat(text: str) -> tuple[str, int, int, int]:
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return rest[0], int(rest[2]), int(rest[3]), int(rest[19])


def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, pgrp, session, start_ticks) of a pid, or None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return _parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def _ppid_and_uid(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["PPid"]), int(fields["Uid"].split()[0])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _first_descendant_of_user(root: int, uid: int) -> int | None:
    """The highest process under `root` running as `uid`: below sudo (and its pty
    monitor, which runs the command in a session of its own), the EngineConn."""
    children: dict[int, list[int]] = {}
    owners: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _ppid_and_uid(int(entry))
            if found is not None:
                children.setdefault(found[0], []).append(int(entry))
                owners[int(entry)] = found[1]
    level = sorted(children.get(root, []))
    while level:
        for pid in level:
            if owners.get(pid) == uid:
                return pid
        level = sorted(c for pid in level for c in children.get(pid, []))
    return None


async def find_main_pid(proc: RunningProcess, uid: int, within: float = 5.0) -> int:
    """The EngineConn's own pid under sudo, once sudo has started it as its user (0 if
    sudo ended first or took longer than `within`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while _is_alive(proc.pid, proc.start_ticks) and loop.time() < deadline:
        found = await asyncio.to_thread(_first_descendant_of_user, proc.pid, uid)
        if found is not None:
            return found
        await asyncio.sleep(0.01)
    return 0


def read_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``: start time in clock ticks after boot."""
    found = _proc_stat(pid)
    return None if found is None else found[3]


def _is_alive(pid: int, start_ticks: int) -> bool:
    """True if ``pid`` is still the process that started at ``start_ticks``."""
    found = _proc_stat(pid)
    return found is not None and found[0] not in ("Z", "X") and found[3] == start_ticks


def _group_members(proc: RunningProcess) -> list[int]:
    """Live (non-zombie) processes of the EngineConn's process group.

    A pid is never reused while it names a live process group, so members of
    ``pgid`` are ours; the session and start-time checks make that hold even in
    the far-fetched case where the group's number came back as someone else's.
    """
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        found = _proc_stat(int(entry))
        if found is None:
            continue
        state, pgrp, session, ticks = found
        if (
            pgrp == proc.pgid
            and session == proc.pgid
            and state not in ("Z", "X")
            and ticks >= proc.start_ticks
        ):
            members.append(int(entry))
    return members


def _signal_group(proc: RunningProcess, sig: signal.Signals) -> bool:
    """Signal the process group if it is still ours; False if there was nothing to signal."""
    if not _is_alive(proc.pid, proc.start_ticks):
        leader = _proc_stat(proc.pid)
        if leader is not None and leader[0] not in ("Z", "X"):
            return False  # the pid now belongs to another process: pid reuse
        if not _group_alive(proc):
            return False
    try:
        os.killpg(proc.pgid, sig)
    except ProcessLookupError:
        return False
    return True


# ----- the launcher ----------------------------------------------------------------------


@dataclass
class _Tracked:
    proc: RunningProcess
    uid: int
    engine: str
    child: asyncio.subprocess.Process | None  # None: re-attached or forked, not our child
    exit: ExitInfo | None = None
    server: ForkServer | None = None  # the fork server it was forked from


class Launcher:
    """Launches, watches, kills and re-attaches EngineConn processes."""

    def __init__(
        self,
        policy: AgentPolicy,
        *,
        lookup_user: UserLookup = default_pwd_lookup,
        today: Callable[[], dt.date] = dt.date.today,
        fork_servers: int = 0,
        fork_server_idle: float = 600.0,
    ) -> None:
        """``lookup_user`` and ``today`` are injectable for tests. ``fork_servers``: how
        many users may have a warm fork server (ecm_agent/forkserver.py); 0: every
        launch goes through sudo and a fresh interpreter."""
        self._policy = policy
        self._lookup_user = lookup_user
        self._today = today
        self._tracked: dict[str, _Tracked] = {}
        self.forks = ForkServers(
            policy,
            prepare=self._prepare_fork_server_dir,
            argv_for=launch_argv,
            sudo_env=SUDO_ENV,
            lookup_user=lookup_user,
            max_servers=fork_servers,
            idle_seconds=fork_server_idle,
        )

    def _prepare_fork_server_dir(
        self, validated: ValidatedLaunch, keep_stdout: bool
    ) -> tuple[Path, int]:
        prepared = prepare_work_dir(self._policy, validated, self._today(), keep_stdout=keep_stdout)
        return prepared.path, prepared.launcher_log_fd

    async def close(self) -> None:
        """The agent stops: fork servers take no more launches (EngineConns keep running)."""
        await self.forks.aclose()

    # -- state files --

    def _state_path(self, ec_id: str) -> Path:
        return self._policy.state_dir / f"{ec_id}.json"

    def _write_state(self, tracked: _Tracked) -> None:
        proc = tracked.proc
        data: dict[str, Any] = {
            "ec_id": proc.ec_id,
            "pid": proc.pid,
            "pgid": proc.pgid,
            "start_ticks": proc.start_ticks,
            "main_pid": proc.main_pid,
            "user": proc.user,
            "uid": tracked.uid,
            "work_dir": str(proc.work_dir),
            "engine": tracked.engine,
        }
        final = self._state_path(proc.ec_id)
        tmp = final.with_name(f".{final.name}.tmp")
        content = memoryview(json.dumps(data).encode())  # one write, not json.dump's many
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            while content:
                content = content[os.write(fd, content) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)  # atomic: a crash leaves the old file or the new one

    def _drop_state(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    # -- public API --

    async def launch(self, spec: LaunchSpec) -> RunningProcess:
        """Validate ``spec``, prepare its work directory and start it as its user.

        Raises :class:`LaunchRefused` (nothing started) when a rule is broken.
        """
        validated = validate_launch(spec, self._policy, self._lookup_user)
        if spec.ec_id in self._tracked or self._state_path(spec.ec_id).exists():
            raise LaunchRefused("ec_id", f"{spec.ec_id} was already launched by this agent")
        os.makedirs(self._policy.state_dir, mode=0o700, exist_ok=True)
        prepared = await asyncio.to_thread(prepare_work_dir, self._policy, validated, self._today())
        work_dir = prepared.path
        try:
            forked = await self.forks.spawn(
                validated, work_dir, launch_environment(validated, work_dir)
            )
        except BaseException:
            os.close(prepared.launcher_log_fd)
            raise
        if forked is not None:
            os.close(prepared.launcher_log_fd)
            pid, start_ticks, server = forked
            proc = RunningProcess(
                ec_id=spec.ec_id,
                pid=pid,
                pgid=pid,
                start_ticks=start_ticks,
                user=spec.user,
                work_dir=work_dir,
            )
            tracked = _Tracked(
                proc=proc, uid=validated.uid, engine=spec.engine, child=None, server=server
            )
            self._tracked[spec.ec_id] = tracked
            self._write_state(tracked)
            log.info("forked %s as %s: pid %d in %s", spec.ec_id, spec.user, pid, work_dir)
            return proc
        try:
            argv = launch_argv(spec.user, validated.uid, work_dir / LAUNCH_SCRIPT)
            child = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=prepared.launcher_log_fd,
                stderr=prepared.launcher_log_fd,
                start_new_session=True,  # own session and process group: pgid == pid
                env=dict(SUDO_ENV),
                cwd=str(work_dir),
            )
        finally:
            os.close(prepared.launcher_log_fd)
        # 0 when it already exited and was reaped: a re-attach then sees it as gone.
        start_ticks = read_start_ticks(child.pid) or 0
        proc = RunningProcess(
            ec_id=spec.ec_id,
            pid=child.pid,
            pgid=child.pid,
            start_ticks=start_ticks,
            user=spec.user,
            work_dir=work_dir,
        )
        if argv[0] == "sudo":
            proc = replace(proc, main_pid=await find_main_pid(proc, validated.uid))
        tracked = _Tracked(proc=proc, uid=validated.uid, engine=spec.engine, child=child)
        self._tracked[spec.ec_id] = tracked
        self._write_state(tracked)
        log.info(
            "launched %s as %s: pid %d (sudo %d) in %s",
            spec.ec_id, spec.user, proc.engine_conn_pid, child.pid, work_dir,
        )  # fmt: skip
        return proc

    async def wait_exit(self, ec_id: str) -> ExitInfo:
        """Wait until the EngineConn's main process ends; its exit code and log tail.

        Raises KeyError for an EngineConn this launcher does not know.
        """
        tracked = self._tracked[ec_id]
        if tracked.exit is None:
            code: int | None = None
            if tracked.child is not None:
                code = await tracked.child.wait()
            else:
                await _wait_gone(tracked.proc)
                if tracked.server is not None:
                    # Gone for the kernel; the code is the fork server's word (it reaped it).
                    status = await tracked.server.exit_status(tracked.proc.pid)
                    if status is not None:
                        with contextlib.suppress(ValueError):
                            code = os.waitstatus_to_exitcode(status)
            if tracked.exit is None:
                tracked.exit = ExitInfo(code, self.log_tail(ec_id))
        return tracked.exit

    def log_tail(self, ec_id: str, lines: int = 20) -> str:
        """The last ``lines`` lines (at most 4 KiB) of ``logs/stderr.log``, else of
        ``stdout.log``, else of ``launcher.log`` (sudo's own messages)."""
        tracked = self._tracked.get(ec_id)
        if tracked is None:
            return ""
        root = Path(os.path.realpath(self._policy.work_root))
        for name in ("stderr.log", "stdout.log", "launcher.log"):
            data = read_tail(root, tracked.proc.work_dir, name, tracked.uid)
            if data.strip():
                return tail_text(data, lines)
        return ""

    async def kill(self, ec_id: str, grace: float | None = None) -> None:
        """TERM the EngineConn's process group, KILL it after ``grace`` seconds
        (default: the policy's). Does nothing if it is gone or unknown."""
        tracked = self._tracked.get(ec_id)
        if tracked is None:
            log.info("kill %s: not known to this agent", ec_id)
            return
        proc = tracked.proc
        grace = self._policy.kill_grace if grace is None else grace
        if not _signal_group(proc, signal.SIGTERM):
            return
        if await _wait_group_gone(proc, grace):
            return
        log.warning("kill %s: still running after %.1fs, sending SIGKILL", ec_id, grace)
        _signal_group(proc, signal.SIGKILL)
        if not await _wait_group_gone(proc, _AFTER_KILL_SECONDS):
            log.error("kill %s: process group %d survived SIGKILL", ec_id, proc.pgid)

    def reattach(self) -> list[RunningProcess]:
        """Re-attach to the EngineConns recorded in the state directory that are
        still running (same pid and start time); drop the other state files.
        Kills nothing."""
        state_dir = self._policy.state_dir
        if not state_dir.is_dir():
            return []
        found: list[RunningProcess] = []
        for path in sorted(state_dir.iterdir()):
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                self._drop_state(path)  # an interrupted atomic write
                continue
            if path.suffix != ".json":
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                proc = RunningProcess(
                    ec_id=str(data["ec_id"]),
                    pid=int(data["pid"]),
                    pgid=int(data["pgid"]),
                    start_ticks=int(data["start_ticks"]),
                    user=str(data["user"]),
                    work_dir=Path(data["work_dir"]),
                    main_pid=int(data.get("main_pid", 0)),
                )
                uid, engine = int(data["uid"]), str(data["engine"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("dropping unreadable state file %s: %s", path, e)
                self._drop_state(path)
                continue
            if proc.ec_id != path.stem:
                log.warning("dropping state file %s: it names %s", path, proc.ec_id)
                self._drop_state(path)
                continue
            known = self._tracked.get(proc.ec_id)
            if known is not None:
                if known.exit is None and self._is_running(known):
                    found.append(known.proc)
                continue
            if proc.pid <= 1 or not _is_alive(proc.pid, proc.start_ticks):
                log.info("dropping state of %s: pid %d is gone or reused", proc.ec_id, proc.pid)
                self._drop_state(path)
                continue
            self._tracked[proc.ec_id] = _Tracked(proc=proc, uid=uid, engine=engine, child=None)
            found.append(proc)
        return found

    def forget(self, ec_id: str) -> None:
        """Remove what the agent remembers of an EngineConn (after the RM's clean-up)."""
        self._tracked.pop(ec_id, None)
        self._drop_state(self._state_path(ec_id))

    def running(self) -> dict[str, RunningProcess]:
        """The tracked EngineConns whose main process is still running."""
        return {
            ec_id: t.proc
            for ec_id, t in self._tracked.items()
            if t.exit is None and self._is_running(t)
        }

    @staticmethod
    def _is_running(tracked: _Tracked) -> bool:
        if tracked.child is not None:
            return tracked.child.returncode is None
        return _is_alive(tracked.proc.pid, tracked.proc.start_ticks)


def _group_exists(proc: RunningProcess) -> bool:
    """Whether any process, zombies included, is in the group (one signal 0)."""
    try:
        os.killpg(proc.pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _group_alive(proc: RunningProcess) -> bool:
    """True while a live process is left in the group. The signal 0 first: when the
    group is empty (the usual case) it answers without scanning all of /proc."""
    return _group_exists(proc) and bool(_group_members(proc))


async def _wait_group_gone(proc: RunningProcess, within: float) -> bool:
    """Until no live process is left in the group; False at the deadline.

    The leader's exit is awaited first (a pidfd: no polling), as the group rarely
    outlives it; then the group is polled with a growing interval. A /proc scan per
    EngineConn every 50 ms was most of the agent's CPU with many kills under way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_wait_gone(proc), within)
    if _group_exists(proc) and loop.time() < deadline:
        # Most often the leader's zombie, which its parent (sudo's waiter, a fork server)
        # reaps at once: a moment's wait spares a scan of /proc.
        await asyncio.sleep(_REAP_WAIT_SECONDS)
    delay = _POLL_SECONDS
    while _group_alive(proc):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * 2, 0.5)
    return True


async def _wait_gone(proc: RunningProcess) -> None:
    """Wait for a process that is not our child to end (no deadline: it is a watch)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return
    except OSError:
        pidfd = -1  # no pidfd support (old kernel, seccomp): fall back to polling
    if pidfd < 0:
        while True:
            if not _is_alive(proc.pid, proc.start_ticks):
                return
            await asyncio.sleep(_REATTACHED_POLL_SECONDS)
    try:
        # Checked after opening the pidfd: it now pins this exact process.
        if not _is_alive(proc.pid, proc.start_ticks):
            return
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(pidfd, on_readable)
        try:
            await ended
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
