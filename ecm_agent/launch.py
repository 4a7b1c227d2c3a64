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
import functools
import json
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ecm_agent.cgroups import Limits, Sample, oom_reason
from ecm_agent.containment import Cgroup, Containment
from ecm_agent.forkserver import ForkServer, ForkServers
from ecm_agent.procs import (
    RunningProcess,
    _is_alive,
    _signal_group,
    _wait_gone,
    _wait_group_gone,
    find_main_pid,
    read_start_ticks,
)
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
#: After SIGKILL the kernel tears the group down quickly; this only bounds the wait.
_AFTER_KILL_SECONDS = 5.0


@dataclass(frozen=True)
class ExitInfo:
    """How an EngineConn ended. ``exit_code`` is None when it is not knowable
    (re-attached processes are not our children); a negative code -N means it
    was killed by signal N (sudo re-raises the command's signal on itself).
    ``oom_reason``: set when it was stopped over its memory; ``usage``: its cgroup's
    last figures (None when it was not contained)."""

    exit_code: int | None
    log_tail: str
    oom_reason: str = ""
    usage: Sample | None = None


# ----- pure parts ------------------------------------------------------------------------


def launch_argv(user: str, uid: int, script: Path, agent_uid: int | None = None) -> list[str]:
    """The command that runs the launch script as `user`: through sudo, except for an
    unprivileged agent launching as itself (dev mode), which needs no sudo rule."""
    me = os.geteuid() if agent_uid is None else agent_uid
    if me != 0 and uid == me:
        return [BASH, str(script)]
    return ["sudo", "-n", "-u", user, "-H", "--", BASH, str(script)]


# ----- the launcher ----------------------------------------------------------------------


@dataclass
class _Tracked:
    proc: RunningProcess
    uid: int
    engine: str
    child: asyncio.subprocess.Process | None  # None: re-attached or forked, not our child
    exit: ExitInfo | None = None
    server: ForkServer | None = None  # the fork server it was forked from
    cgroup: Cgroup | None = None  # None: not contained (isolation none, or launched so)
    ending: asyncio.Lock = field(default_factory=asyncio.Lock)


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
        containment: Containment | None = None,
    ) -> None:
        """``lookup_user`` and ``today`` are injectable for tests. ``fork_servers``: how
        many users may have a warm fork server (ecm_agent/forkserver.py); 0: every
        launch goes through sudo and a fresh interpreter. ``containment``: each
        EngineConn gets a cgroup (ecm_agent/containment.py); None: none does."""
        self._policy = policy
        self._lookup_user = lookup_user
        self._today = today
        self._tracked: dict[str, _Tracked] = {}
        self.containment = containment
        self.forks = ForkServers(
            policy,
            prepare=self._prepare_fork_server_dir,
            argv_for=launch_argv,
            sudo_env=SUDO_ENV,
            lookup_user=lookup_user,
            max_servers=fork_servers,
            idle_seconds=fork_server_idle,
            containment=containment,
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
        limits = tracked.cgroup.limits if tracked.cgroup is not None else Limits()
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
            "cgroup": proc.cgroup,
            "limits": [limits.memory_bytes, limits.cpu_millis, limits.pids],
        }
        final = self._state_path(proc.ec_id)
        tmp = final.with_name(f".{final.name}.tmp")
        content = memoryview(json.dumps(data).encode())  # one write, not json.dump's many
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            while content:
                content = content[os.write(fd, content) :]
        finally:
            os.close(fd)
        # Atomic: an agent that dies leaves the old file or the new one. No fsync: the file
        # has to outlive the agent's process, not the machine (after a machine's crash its
        # EngineConns are gone as well, and a file cut short is dropped as unreadable); an
        # fsync per launch stalled the agent's loop on the disk.
        os.replace(tmp, final)

    def _drop_state(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    # -- public API --

    async def launch(self, spec: LaunchSpec) -> RunningProcess:
        """Validate ``spec``, prepare its work directory and start it as its user, in a
        cgroup of its own made first (when the agent contains its EngineConns).

        Raises :class:`LaunchRefused` (nothing started) when a rule is broken.
        """
        validated = validate_launch(spec, self._policy, self._lookup_user)
        if spec.ec_id in self._tracked or self._state_path(spec.ec_id).exists():
            raise LaunchRefused("ec_id", f"{spec.ec_id} was already launched by this agent")
        os.makedirs(self._policy.state_dir, mode=0o700, exist_ok=True)
        prepared = await asyncio.to_thread(prepare_work_dir, self._policy, validated, self._today())
        cgroup: Cgroup | None = None
        try:
            if self.containment is not None:
                limits = Limits(spec.memory_bytes, spec.cpu_millis)
                cgroup = self.containment.create(spec.ec_id, limits)
            tracked = await self._start(validated, prepared, cgroup)
        except BaseException:
            if cgroup is not None and self.containment is not None:
                await self.containment.destroy(cgroup)
            raise
        finally:
            os.close(prepared.launcher_log_fd)
        self._tracked[spec.ec_id] = tracked
        self._write_state(tracked)
        proc = tracked.proc
        how = "forked" if tracked.child is None else f"launched (sudo {proc.pid})"
        log.info(
            "%s %s as %s: pid %d in %s%s",
            how, spec.ec_id, spec.user, proc.engine_conn_pid, proc.work_dir,
            f", cgroup {cgroup.name}" if cgroup is not None else "",
        )  # fmt: skip
        return proc

    async def _start(
        self, validated: ValidatedLaunch, prepared: PreparedWorkDir, cgroup: Cgroup | None
    ) -> _Tracked:
        """Forks the launch from its user's fork server, else runs it through sudo."""
        spec, work_dir = validated.spec, prepared.path
        name = cgroup.name if cgroup is not None else ""
        hold = None
        if cgroup is not None and self.containment is not None:
            hold = functools.partial(self.containment.move, cgroup)
        env = launch_environment(validated, work_dir)
        forked = await self.forks.spawn(validated, work_dir, env, hold)
        if forked is not None:
            pid, start_ticks, server = forked
            proc = RunningProcess(spec.ec_id, pid, pid, start_ticks, spec.user, work_dir, 0, name)
            return _Tracked(proc, validated.uid, spec.engine, None, server=server, cgroup=cgroup)
        argv = launch_argv(spec.user, validated.uid, work_dir / LAUNCH_SCRIPT)
        sudo = argv[0] == "sudo"
        if cgroup is not None and self.containment is not None:
            argv = [*self.containment.join_command(cgroup), *argv]
        child = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=prepared.launcher_log_fd,
            stderr=prepared.launcher_log_fd,
            start_new_session=True,  # own session and process group: pgid == pid
            env=dict(SUDO_ENV),
            cwd=str(work_dir),
        )
        # 0 when it already exited and was reaped: a re-attach then sees it as gone.
        start_ticks = read_start_ticks(child.pid) or 0
        proc = RunningProcess(
            spec.ec_id, child.pid, child.pid, start_ticks, spec.user, work_dir, 0, name
        )
        if sudo:
            proc = replace(proc, main_pid=await find_main_pid(proc, validated.uid))
        return _Tracked(proc, validated.uid, spec.engine, child, cgroup=cgroup)

    async def wait_exit(self, ec_id: str) -> ExitInfo:
        """Wait until the EngineConn's main process ends; its exit code and log tail.
        A contained EngineConn's cgroup is then ended and removed (whatever it left
        running goes with it), and says whether it was stopped over its memory.

        Raises KeyError for an EngineConn this launcher does not know.
        """
        tracked = self._tracked[ec_id]
        async with tracked.ending:  # once, whoever else waits
            if tracked.exit is None:
                code = await self._exit_code(tracked)
                oom, usage = await self._end_cgroup(tracked)
                tracked.exit = ExitInfo(code, self.log_tail(ec_id), oom, usage)
        return tracked.exit

    async def _exit_code(self, tracked: _Tracked) -> int | None:
        if tracked.child is not None:
            return await tracked.child.wait()
        await _wait_gone(tracked.proc)
        if tracked.server is None:
            return None
        # Gone for the kernel; the code is the fork server's word (it reaped it).
        status = await tracked.server.exit_status(tracked.proc.pid)
        if status is not None:
            with contextlib.suppress(ValueError):
                return os.waitstatus_to_exitcode(status)
        return None

    async def _end_cgroup(self, tracked: _Tracked) -> tuple[str, Sample | None]:
        """Ends and removes the cgroup of an EngineConn whose main process has ended:
        (the reason if it was over its memory, its last figures)."""
        cgroup, containment = tracked.cgroup, self.containment
        if cgroup is None or containment is None:
            return "", None
        last = containment.sample(cgroup)
        if not await containment.destroy(cgroup):
            log.error("EngineConn %s: its cgroup %s could not be removed", tracked.proc.ec_id,
                      cgroup.name)  # fmt: skip
        over = last is not None and last.oom_kills > 0
        return (oom_reason(cgroup.limits) if over else ""), last

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
        (default: the policy's); then end whatever is left in its cgroup (a process
        that left the group, with setsid or a double fork, is still in the cgroup).
        Does nothing if it is gone or unknown."""
        tracked = self._tracked.get(ec_id)
        if tracked is None:
            await self._kill_unknown(ec_id)
            return
        proc = tracked.proc
        grace = self._policy.kill_grace if grace is None else grace
        if _signal_group(proc, signal.SIGTERM) and not await _wait_group_gone(proc, grace):
            log.warning("kill %s: still running after %.1fs, sending SIGKILL", ec_id, grace)
            _signal_group(proc, signal.SIGKILL)
            if tracked.cgroup is None and not await _wait_group_gone(proc, _AFTER_KILL_SECONDS):
                log.error("kill %s: process group %d survived SIGKILL", ec_id, proc.pgid)
        if tracked.cgroup is not None and self.containment is not None:
            await self.containment.kill(tracked.cgroup)

    async def _kill_unknown(self, ec_id: str) -> None:
        """An EngineConn the agent does not track (its state was lost): its cgroup, if
        one is left, is ended all the same."""
        if self.containment is not None:
            with contextlib.suppress(ValueError):
                cgroup = self.containment.cgroup(ec_id)
                if self.containment.exists(cgroup):
                    log.info("kill %s: not tracked; ending what is left in its cgroup", ec_id)
                    await self.containment.destroy(cgroup)
                    return
        log.info("kill %s: not known to this agent", ec_id)

    async def stop_over_memory(self, ec_id: str) -> None:
        """Ends an EngineConn whose cgroup's OOM killer struck (all of it, at once: it
        is over its memory); its exit then reports why."""
        tracked = self._tracked.get(ec_id)
        if tracked is not None and tracked.cgroup is not None and self.containment is not None:
            log.warning("EngineConn %s is over its memory: stopping it", ec_id)
            await self.containment.kill(tracked.cgroup)

    def contained(self) -> dict[str, Cgroup]:
        """The cgroup of every contained EngineConn still running."""
        return {
            ec_id: t.cgroup
            for ec_id, t in self._tracked.items()
            if t.exit is None and t.cgroup is not None
        }

    def samples(self, cgroups: Mapping[str, Cgroup]) -> dict[str, Sample]:
        """The current figures of `cgroups` (from `contained`; reads files: call it off
        the event loop, which may change the launcher meanwhile)."""
        out: dict[str, Sample] = {}
        if self.containment is None:
            return out
        for ec_id, cgroup in cgroups.items():
            sample = self.containment.sample(cgroup)
            if sample is not None:
                out[ec_id] = sample
        return out

    async def end_all(self, grace: float | None = None) -> None:
        """The RM has shut this agent down for good: every EngineConn is killed (TERM,
        then its cgroup), the fork servers go, and the agent's cgroups are removed."""
        await asyncio.gather(*(self.kill(ec_id, grace) for ec_id in self.running()))
        await self.forks.aclose()
        if self.containment is not None:
            await self.containment.teardown()

    async def sweep_cgroups(self) -> None:
        """At start, after `reattach`: ends every cgroup under the agent's parent that
        no running EngineConn of this agent owns (what EngineConns that ended while the
        agent was away left behind, a previous run's fork servers)."""
        if self.containment is None:
            return
        owned = {t.cgroup.name for t in self._tracked.values() if t.cgroup is not None}
        for name in self.containment.children():
            if name not in owned:
                log.info("ending the orphaned cgroup %s", name)
                await self.containment.destroy(self.containment.cgroup(name))

    def reattach(self) -> list[RunningProcess]:
        """Re-attach to the EngineConns recorded in the state directory that are
        still running (same pid and start time); drop the other state files.
        Kills nothing (`sweep_cgroups` then ends what the dropped ones left)."""
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
            loaded = self._load_state(path)
            if loaded is None:
                continue
            proc, uid, engine, cgroup = loaded
            known = self._tracked.get(proc.ec_id)
            if known is not None:
                if known.exit is None and self._is_running(known):
                    found.append(known.proc)
                continue
            if proc.pid <= 1 or not _is_alive(proc.pid, proc.start_ticks):
                log.info("dropping state of %s: pid %d is gone or reused", proc.ec_id, proc.pid)
                self._drop_state(path)
                continue
            self._tracked[proc.ec_id] = _Tracked(proc, uid, engine, None, cgroup=cgroup)
            found.append(proc)
        return found

    def _load_state(self, path: Path) -> tuple[RunningProcess, int, str, Cgroup | None] | None:
        """A state file's process, uid, engine and cgroup (None: dropped, unreadable)."""
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
                cgroup=str(data.get("cgroup", "")),
            )
            uid, engine = int(data["uid"]), str(data["engine"])
            memory, cpu, pids = (int(v) for v in data.get("limits", (0, 0, 0)))
            cgroup = None
            if proc.cgroup and self.containment is not None:
                cgroup = self.containment.cgroup(proc.cgroup, Limits(memory, cpu, pids))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("dropping unreadable state file %s: %s", path, e)
            self._drop_state(path)
            return None
        if proc.ec_id != path.stem:
            log.warning("dropping state file %s: it names %s", path, proc.ec_id)
            self._drop_state(path)
            return None
        return proc, uid, engine, cgroup

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
