"""Fork servers: a warm EngineConn interpreter per recently used user.

A cold EngineConn start is sudo, bash, a fresh Python and its imports (grpc, protobuf,
asyncio): ~150 ms of CPU on a small VM, most of it the imports, paid again by every
launch. A fork server (``python -m engineconn --fork-server``, ``engineconn/forkserver.py``)
is that interpreter with the imports done, started once per user and kept while the user
launches; each launch is then a fork of it: ~30 ms of CPU and no sudo.

It is started exactly as an EngineConn is, and so is bound by the same rules:

* through ``sudo -n -u USER -H -- /bin/bash <work_root>/<user>/<yyyymmdd>/forkserver/<id>/
  launch.sh`` (the one command shape the sudoers rule allows), after ``validate_launch`` of its own
  launch (the user: allowed, not root, uid >= min_uid; the program: the agent's python);
  its launch.sh is root's, written like every other, and leaves stdin / stdout to the
  agent (the pipes of the protocol);
* it runs as the user, with the user's rights only, and gets only that user's launches:
  servers are kept per (user, interpreter), never shared;
* a launch is forked only when it is one the runtime would run anyway -- program
  ``python`` mapped to that very interpreter, ``-m engineconn ARGS`` -- and its environment
  only names ``LABELRM_*`` and ``TMPDIR`` (anything an interpreter reads at start-up, such as
  ``PYTHON*``, ``LC_*``, ``HOME``, takes the sudo path, where a fresh interpreter sees it). The
  request is validated and its work directory prepared (material files, launch.sh) before,
  exactly as for sudo; no shell sees any of it: the server gets argv and environment as
  JSON and sets them directly;
* the child is the EngineConn launch.sh would have made: own session and process group
  (so kill reaches all of it), its work directory, umask 0027, stdin /dev/null, its
  log files. It gets a state file like any launch, so a restarted agent re-attaches it;
* the server runs as the user, so the agent believes nothing it says: a pid it reports
  must be, in /proc, its own child, a session leader of its own group, with all four uids
  the user's, or the launch fails and the server is stopped; an exit counts once the
  kernel says the process is gone (pidfd), the server only adds the exit code.

When the agent stops or a server has been idle for ``idle_seconds``, its stdin is closed:
it starts nothing more and exits once its last EngineConn has ended (so their exit codes
are still known). EngineConns never depend on their server: killing it leaves them
running (their exit codes are then unknown, as after an agent restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ecm_agent.cgroups import Limits
from ecm_agent.containment import Cgroup, Containment
from ecm_agent.validate import (
    AgentPolicy,
    LaunchSpec,
    UserLookup,
    ValidatedLaunch,
    validate_launch,
)
from labelrm_common import forkserver_wire as wire

log = logging.getLogger(__name__)

#: The engine-directory name of the fork servers' own work directories.
FORK_SERVER_ENGINE = "forkserver"
FORK_SERVER_ARGV = ("-m", "engineconn", "--fork-server")
#: Variables a forked launch may carry: none of them is read by an interpreter starting.
FORKABLE_ENV_RE = re.compile(r"LABELRM_[A-Za-z0-9_]*|TMPDIR")
START_TIMEOUT_SECONDS = 30.0
#: The agent carries out commands one at a time, and a server is the user's process (the
#: user can stop it): a launch waits this long at most, then the server is killed, the
#: launch fails and the user's launches take the sudo path for a while (RETRY_AFTER).
SPAWN_TIMEOUT_SECONDS = 5.0
#: After a server failed to start, its user's launches take the sudo path for this long,
#: doubled after each further failure up to RETRY_MAX_SECONDS (say, a runtime installed
#: before fork servers existed: `--fork-server` is not an option there).
RETRY_AFTER_SECONDS = 60.0
RETRY_MAX_SECONDS = 3600.0
#: With every slot taken, a server used within this long is not closed for a newcomer
#: (whose launches go through sudo meanwhile): more users than slots must not make the
#: servers churn, each start costing what a cold launch costs.
KEEP_RECENT_SECONDS = 60.0
#: How long an exit is waited for once the process is gone (the server reaps it first).
EXIT_CODE_WAIT_SECONDS = 2.0
_LINE_LIMIT = 64 * 1024
#: A fork server's own cgroup: its imports done it needs ~60 MiB and little CPU; the
#: bound is for a server its user has tampered with (it is the user's process).
FORK_SERVER_LIMITS = Limits(memory_bytes=512 * 2**20, cpu_millis=1000)
_KEPT_EXITS = 4096


class ForkServerError(OSError):
    """A fork server failed a launch it was given (the launch fails; nothing to retry)."""


def forkable_argv(validated: ValidatedLaunch, python: str) -> list[str] | None:
    """The runtime's arguments when this launch may be forked from the fork server of
    `python`, else None (the launch takes the sudo path)."""
    spec = validated.spec
    if spec.program != "python" or validated.program_path != python:
        return None
    if spec.argv[:2] != ("-m", "engineconn") or "--fork-server" in spec.argv:
        return None
    return list(spec.argv[2:])


def forkable_env(environment: Mapping[str, str]) -> bool:
    """True if no variable of the launch would matter to a starting interpreter."""
    return all(FORKABLE_ENV_RE.fullmatch(name) for name in environment)


@dataclass(frozen=True)
class _Identity:
    state: str
    ppid: int
    pgrp: int
    session: int
    start_ticks: int
    uids: tuple[int, ...]


def _identity(pid: int) -> _Identity | None:
    """What /proc says about `pid` (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            status = f.read()
        rest = stat[stat.rindex(")") + 2 :].split()
        uids: tuple[int, ...] = ()
        for line in status.splitlines():
            if line.startswith("Uid:"):
                uids = tuple(int(x) for x in line.split()[1:])
                break
        return _Identity(rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]), uids)
    except (OSError, ValueError, IndexError):
        return None


@dataclass(eq=False)
class ForkServer:
    """One user's fork server, as the agent sees it."""

    user: str
    uid: int
    python: str
    work_dir: Path
    process: asyncio.subprocess.Process  # sudo (or bash, unprivileged dev mode)
    pid: int = 0  # the server itself, once it said ready and /proc agreed
    holds: bool = False  # it can hold a child until the agent says go (a cgroup move)
    cgroup: Cgroup | None = None  # its own cgroup, when the agent contains its launches
    containment: Containment | None = None
    last_used: float = field(default_factory=time.monotonic)
    closing: bool = False
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _reply: asyncio.Future[wire.Reply] | None = None
    _spawned: set[int] = field(default_factory=set)
    _exits: dict[int, int] = field(default_factory=dict)  # pid -> wait status
    _exit_waiters: dict[int, asyncio.Future[int | None]] = field(default_factory=dict)
    _eof: bool = False
    _reader: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """Ready and accepting launches."""
        return self.pid > 0 and not self._eof and not self.closing

    async def wait_ready(self, within: float) -> None:
        """Reads the first line, checks the pid it names; raises ForkServerError."""
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), within)
        except (TimeoutError, ValueError) as exc:
            raise ForkServerError(f"no ready line: {exc!r}") from None
        try:
            message = wire.decode_reply(line)
        except wire.WireError:
            message = None
        if not isinstance(message, wire.Ready) or message.pid <= 1:
            raise ForkServerError("did not start (see its logs/stderr.log)")
        pid = message.pid
        found = _identity(pid)
        # sudo forks the command; without sudo (dev mode), bash execs it in place.
        parents = (self.process.pid,) if pid != self.process.pid else ()
        if (
            found is None
            or found.state in ("Z", "X")
            or (parents and found.ppid not in parents)
            or not found.uids
            or any(u != self.uid for u in found.uids)
        ):
            raise ForkServerError(f"reported pid {pid}, which is not its own process")
        self.pid = pid
        self.holds = message.hold
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    break
                try:
                    self._dispatch(wire.decode_reply(line))
                except (wire.WireError, TypeError) as exc:
                    log.warning("fork server of %s sent %r: stopping it", self.user, exc)
                    break
        except (ValueError, asyncio.LimitOverrunError, OSError) as exc:
            log.warning("fork server of %s: %r; stopping it", self.user, exc)
        finally:
            self._eof = True
            if self._reply is not None and not self._reply.done():
                self._reply.set_exception(ForkServerError("the fork server went away"))
            for waiter in self._exit_waiters.values():
                if not waiter.done():
                    waiter.set_result(None)
            if self.process.returncode is None and not self.closing:
                self.kill()
        await self.process.wait()  # reaps sudo (not when cancelled: the agent is stopping)
        await self.end_cgroup()

    async def end_cgroup(self) -> None:
        """Once the server has exited: ends whatever is left in its cgroup, removes it."""
        if self.containment is not None and self.cgroup is not None:
            await self.containment.destroy(self.cgroup)

    def _dispatch(self, message: wire.Reply) -> None:
        if isinstance(message, wire.Exit):
            if message.pid in self._spawned:
                self._spawned.discard(message.pid)
                self._exits[message.pid] = message.status
                while len(self._exits) > _KEPT_EXITS:
                    del self._exits[next(iter(self._exits))]
                waiter = self._exit_waiters.pop(message.pid, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(message.status)
            return
        if isinstance(message, wire.Ready) or self._reply is None or self._reply.done():
            raise TypeError("an answer nobody asked for")
        if isinstance(message, wire.Spawned) and message.pid > 1:
            # Now, before the next line: an EngineConn that ends at once has its exit
            # right behind this answer.
            self._spawned.add(message.pid)
        self._reply.set_result(message)

    async def spawn(
        self,
        ec_id: str,
        work_dir: Path,
        argv: Sequence[str],
        env: Mapping[str, str],
        hold: Callable[[int], None] | None = None,
    ) -> tuple[int, int] | None:
        """Forks the EngineConn; (pid, start ticks). None if the request could not be
        delivered (nothing was started: the sudo path may be taken); ForkServerError if
        it was delivered and failed (a process may exist: the launch fails).

        `hold(pid)`, if given, runs while the child waits before running any of the
        EngineConn (it moves the child into the EngineConn's cgroup); then it goes on."""
        async with self._lock:
            if not self.alive or self.process.stdin is None or (hold and not self.holds):
                return None
            self.last_used = time.monotonic()
            request = wire.Spawn(ec_id, str(work_dir), tuple(argv), dict(env), hold is not None)
            self._reply = asyncio.get_running_loop().create_future()
            try:
                self.process.stdin.write(wire.encode(request))
                await self.process.stdin.drain()
            except (OSError, RuntimeError):
                self._reply = None
                return None  # it never got the request
            try:
                reply = await asyncio.wait_for(self._reply, SPAWN_TIMEOUT_SECONDS)
            except TimeoutError:
                self.kill()
                raise ForkServerError("the fork server did not answer in time") from None
            finally:
                self._reply = None
            if isinstance(reply, wire.Failed) and reply.ec_id == ec_id:
                raise ForkServerError(f"fork server: {reply.error[:500]}")
            if not isinstance(reply, wire.Spawned) or reply.ec_id != ec_id or reply.pid <= 1:
                if isinstance(reply, wire.Spawned):
                    self._spawned.discard(reply.pid)
                self.kill()
                raise ForkServerError("the fork server answered another request")
            pid = reply.pid
            ticks = self._check_child(pid)
            if hold is not None:
                await self._release(pid, ticks, hold)
            return pid, ticks

    async def _release(self, pid: int, ticks: int, hold: Callable[[int], None]) -> None:
        """Runs `hold(pid)` on the held child, then lets it go (ForkServerError, the
        child killed, if `hold` fails)."""
        assert self.process.stdin is not None
        try:
            if ticks == 0:
                raise OSError(f"pid {pid} is gone")
            hold(pid)
        except OSError as exc:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
            raise ForkServerError(f"cannot contain the forked EngineConn: {exc}") from None
        try:
            self.process.stdin.write(wire.encode(wire.Go(pid)))
            await self.process.stdin.drain()
        except (OSError, RuntimeError):
            pass  # the server is gone: the held child sees its pipe end and exits

    def _check_child(self, pid: int) -> int:
        """The child's start ticks, after /proc confirmed it is ours (0: already gone)."""
        found = _identity(pid)
        if found is None:
            return 0  # it ended at once and was reaped: its exit follows
        if (
            found.ppid != self.pid
            or found.pgrp != pid
            or found.session != pid
            or not found.uids
            or any(u != self.uid for u in found.uids)
        ):
            self._spawned.discard(pid)
            self.kill()
            raise ForkServerError(f"fork server reported pid {pid}, which is not its child")
        return found.start_ticks

    async def exit_status(self, pid: int, within: float = EXIT_CODE_WAIT_SECONDS) -> int | None:
        """The wait status the server reported for `pid` (None if it cannot say)."""
        if pid in self._exits:
            return self._exits.pop(pid)
        if self._eof or pid not in self._spawned:
            return None
        waiter = self._exit_waiters.get(pid)
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            self._exit_waiters[pid] = waiter
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), within)
        except TimeoutError:
            return None
        finally:
            if waiter.done():
                self._exit_waiters.pop(pid, None)
                self._exits.pop(pid, None)

    def close(self) -> None:
        """No more launches: it exits once its last EngineConn has ended."""
        self.closing = True
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()

    def kill(self) -> None:
        """Stops the server now (its EngineConns, in their own sessions, go on)."""
        self.closing = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, 9)  # sudo's own session: the server and sudo

    async def aclose(self) -> None:
        """Stops reading (the agent is going away)."""
        self.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


# What ForkServers needs from the launcher: prepare a work directory (path, launcher log fd).
PrepareDir = Callable[[ValidatedLaunch, bool], "tuple[Path, int]"]
LaunchArgv = Callable[[str, int, Path], "list[str]"]


class ForkServers:
    """The agent's fork servers: at most `max_servers`, one per (user, interpreter),
    started on a user's first forkable launch, closed after `idle_seconds` unused."""

    def __init__(
        self,
        policy: AgentPolicy,
        *,
        prepare: PrepareDir,
        argv_for: LaunchArgv,
        sudo_env: Mapping[str, str],
        lookup_user: UserLookup,
        max_servers: int,
        idle_seconds: float,
        containment: Containment | None = None,
    ) -> None:
        self._policy = policy
        # With containment, each server runs in a cgroup of its own and holds each child
        # until the agent has moved it into its EngineConn's cgroup.
        self._containment = containment
        self._prepare = prepare
        self._argv_for = argv_for
        self._sudo_env = dict(sudo_env)
        self._lookup_user = lookup_user
        self.max_servers = max_servers
        self.idle_seconds = idle_seconds
        self._servers: dict[tuple[str, str], ForkServer] = {}
        self._starting: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._retry_at: dict[tuple[str, str], float] = {}
        self._failures: dict[tuple[str, str], int] = {}
        self._closed: list[ForkServer] = []  # closing: still reaping their EngineConns
        self._sweeper: asyncio.Task[None] | None = None

    def servers(self) -> dict[tuple[str, str], ForkServer]:
        """The live servers by (user, interpreter)."""
        return {k: s for k, s in self._servers.items() if s.alive}

    def starting(self) -> int:
        """How many servers are being started."""
        return len(self._starting)

    def backing_off(self, user: str) -> bool:
        """Whether the user's launches go through sudo for now, without trying to start
        a server for them (one failed lately)."""
        now = time.monotonic()
        return any(key[0] == user and now < at for key, at in self._retry_at.items())

    async def spawn(
        self,
        validated: ValidatedLaunch,
        work_dir: Path,
        env: Mapping[str, str],
        hold: Callable[[int], None] | None = None,
    ) -> tuple[int, int, ForkServer] | None:
        """Forks the launch from its user's server: (pid, start ticks, server). None when
        it is not forkable or no server is ready (one is then started for the next).
        `hold`: see ForkServer.spawn (required when the agent contains its launches)."""
        python = self._policy.programs.get("python", "")
        argv = forkable_argv(validated, python)
        if self.max_servers <= 0 or argv is None or not forkable_env(env):
            return None
        key = (validated.spec.user, python)
        server = self._servers.get(key)
        if server is None or not server.alive:
            if server is not None:
                self._retire(key)
            self._start_soon(key, validated)
            return None
        try:
            spawned = await server.spawn(validated.spec.ec_id, work_dir, argv, env, hold)
        except ForkServerError:
            if server.closing:  # it was stopped (no answer, or a lie): back off
                self._retire(key)
                self._back_off(key)
            raise
        if spawned is None:
            return None
        return spawned[0], spawned[1], server

    def _start_soon(self, key: tuple[str, str], validated: ValidatedLaunch) -> None:
        if key in self._starting or time.monotonic() < self._retry_at.get(key, 0.0):
            return
        self._evict()
        if len(self._servers) + len(self._starting) >= self.max_servers:
            return
        task = asyncio.ensure_future(self._start(key, validated))
        self._starting[key] = task
        task.add_done_callback(lambda _t: self._starting.pop(key, None))
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())

    async def _start(self, key: tuple[str, str], validated: ValidatedLaunch) -> None:
        user, python = key
        spec = LaunchSpec(
            ec_id=f"fs-{secrets.token_hex(8)}",
            user=user,
            engine=FORK_SERVER_ENGINE,
            program="python",
            argv=FORK_SERVER_ARGV,
        )
        server: ForkServer | None = None
        cgroup: Cgroup | None = None
        try:
            # Its own launch passes the same rules as any (user, program, paths).
            checked = validate_launch(spec, self._policy, self._lookup_user)
            work_dir, log_fd = await asyncio.to_thread(self._prepare, checked, True)
            argv = self._argv_for(user, checked.uid, work_dir / "launch.sh")
            try:
                if self._containment is not None:
                    cgroup = self._containment.create(spec.ec_id, FORK_SERVER_LIMITS)
                    argv = [*self._containment.join_command(cgroup), *argv]
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log_fd,
                    start_new_session=True,
                    env=dict(self._sudo_env),
                    cwd=str(work_dir),
                    limit=_LINE_LIMIT,
                )
            finally:
                os.close(log_fd)
            server = ForkServer(
                user, checked.uid, python, work_dir, process, cgroup=cgroup,
                containment=self._containment,
            )  # fmt: skip
            await server.wait_ready(START_TIMEOUT_SECONDS)
            if self._containment is not None and not server.holds:
                raise ForkServerError("its runtime cannot hold a child for its cgroup (older)")
        except asyncio.CancelledError:
            if server is not None:
                server.close()  # its stdin pipe closed while the loop still runs
                server.kill()
            raise
        except (OSError, ValueError) as exc:  # LaunchRefused is a ValueError
            wait = self._back_off(key)
            log.warning("no fork server for %s (sudo for %gs): %s", user, wait, exc)
            if server is not None:
                server.kill()
                with contextlib.suppress(Exception):
                    await server.process.wait()
            if cgroup is not None and self._containment is not None:
                await self._containment.destroy(cgroup)
            return
        log.info("fork server for %s ready: pid %d in %s", user, server.pid, server.work_dir)
        self._failures.pop(key, None)
        self._servers[key] = server

    def _back_off(self, key: tuple[str, str]) -> float:
        """After a failure: the user's launches go through sudo for a while (doubling)."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        wait = float(min(RETRY_AFTER_SECONDS * 2 ** (failures - 1), RETRY_MAX_SECONDS))
        self._retry_at[key] = time.monotonic() + wait
        return wait

    def _retire(self, key: tuple[str, str]) -> None:
        server = self._servers.pop(key, None)
        if server is not None:
            server.close()
            self._closed.append(server)
        self._closed = [s for s in self._closed if not s._eof]

    def _evict(self) -> None:
        """Closes idle servers, and the least recently used one when all slots are taken."""
        now = time.monotonic()
        for key, server in list(self._servers.items()):
            if not server.alive or now - server.last_used > self.idle_seconds:
                self._retire(key)
        if len(self._servers) >= self.max_servers:
            oldest = min(self._servers, key=lambda k: self._servers[k].last_used)
            if now - self._servers[oldest].last_used > KEEP_RECENT_SECONDS:
                self._retire(oldest)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, min(self.idle_seconds / 2, 60.0)))
            now = time.monotonic()
            for key, server in list(self._servers.items()):
                if not server.alive or now - server.last_used > self.idle_seconds:
                    log.info("closing the fork server of %s (idle)", key[0])
                    self._retire(key)

    async def aclose(self) -> None:
        """The agent stops: no more launches; the servers exit after their EngineConns."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._starting.values()):
            task.cancel()
        servers = [*self._servers.values(), *self._closed]
        self._servers.clear()
        for server in servers:
            await server.aclose()
