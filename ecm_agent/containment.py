"""The agent's cgroups: one per EngineConn under a parent the agent owns, made before the
EngineConn's first process (the launch's shell, sudo, everything after) runs, holding it
to what the RM granted, measured while it runs, and ended whole.

    detect ── prepare (the parent) ── create (limits) ── join / move ── sample ...
                                                                     └─ kill ── remove

The layouts and the files are in ecm_agent/cgroups.py. Everything here runs as root and
touches only directories under the agent's parent; the names in it are EngineConn ids
(validated by the launch) and fork server names the agent makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ecm_agent.cgroups import (
    V2_CONTROLLERS,
    Layout,
    Limits,
    NoContainment,
    Sample,
    limit_writes,
    parse_keyed,
    parse_mountinfo,
    parse_proc_cgroup,
    plan_layout,
)

log = logging.getLogger(__name__)

#: The command prefix that puts itself into the cgroup, then runs the rest (sudo ...):
#: argv is `sh -c JOIN sh N PROCS_1 .. PROCS_N COMMAND...`. A shell, not Python's
#: preexec_fn, which is unsafe in a process with threads (the agent has some).
JOIN_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift;'
    ' n=$((n - 1)); done; exec "$@"'
)
SH = "/bin/sh"
#: How long a kill waits for the freezer to report FROZEN before killing anyway.
_FREEZE_WAIT_SECONDS = 1.0
_KILL_WITHIN_SECONDS = 10.0
NO_LIMITS = Limits()


def detect_layout(cgroup_root: Path, parent: str) -> Layout:
    """This host's layout for a parent cgroup `parent` (raises NoContainment)."""
    try:
        mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        raise NoContainment(f"cannot read this process's cgroups: {exc.strerror}") from None

    def v2_controllers(directory: Path) -> frozenset[str]:
        try:
            return frozenset((directory / "cgroup.controllers").read_text().split())
        except OSError:
            return frozenset()

    return plan_layout(mounts, own, cgroup_root, parent, v2_controllers)


def _write(path: Path, value: str) -> None:
    # One write(2): the kernel parses each write of a cgroup file on its own.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        if exc.errno == errno.ENODEV:  # removed under us
            return None
        raise


def _read_int(path: Path) -> int:
    text = _read(path)
    try:
        return int(text.strip()) if text else 0
    except ValueError:
        return 0


@dataclass(frozen=True)
class Cgroup:
    """One EngineConn's (or fork server's) cgroup: its directory in each hierarchy."""

    name: str
    dirs: tuple[tuple[str, Path], ...]  # (controller, directory), every controller used
    limits: Limits = field(default_factory=Limits)

    def dir_of(self, controller: str) -> Path:
        """The directory of the hierarchy carrying `controller`."""
        return dict(self.dirs)[controller]

    @property
    def directories(self) -> tuple[Path, ...]:
        """Each directory once."""
        return tuple(dict.fromkeys(d for _, d in self.dirs))


class Containment:
    """Creates, joins, measures and ends the cgroups of one agent's EngineConns."""

    def __init__(self, layout: Layout, pids_max: int) -> None:
        self.layout = layout
        self.pids_max = pids_max

    @property
    def version(self) -> int:
        return self.layout.version

    # ----- the parent ----------------------------------------------------------------

    def prepare(self) -> None:
        """Creates the agent's parent cgroup in each hierarchy (v2: hands it the
        controllers, having first moved the agent into a leaf of its own cgroup); raises
        NoContainment (one line) when this process may not."""
        try:
            if self.version == 2:
                self._prepare_v2()
            else:
                for h in self.layout.hierarchies:
                    h.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            where = exc.filename or "the cgroup hierarchy"
            raise NoContainment(f"cannot set up {where}: {exc.strerror}") from None

    def _prepare_v2(self) -> None:
        (h,) = self.layout.hierarchies
        leaf = self.layout.agent_leaf
        if leaf is not None:
            leaf.mkdir(exist_ok=True)
            _write(leaf / "cgroup.procs", str(os.getpid()))
        enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
        chain = [h.parent, *h.parent.parents]
        missing = [d for d in chain if not d.exists()]
        down = [missing[-1].parent, *reversed(missing)] if missing else [h.parent.parent, h.parent]
        # Each cgroup from the nearest existing ancestor down hands the controllers on.
        for directory in down:
            directory.mkdir(exist_ok=True)
            _write(directory / "cgroup.subtree_control", enable)

    def children(self) -> list[str]:
        """The names of the cgroups under the parent (EngineConns, fork servers)."""
        names: set[str] = set()
        for h in self.layout.hierarchies:
            with contextlib.suppress(OSError):
                entries = os.scandir(h.parent)
                names.update(e.name for e in entries if e.is_dir(follow_symlinks=False))
        return sorted(names)

    async def teardown(self) -> None:
        """Ends every cgroup under the parent and removes the parent (the agent leaves
        for good: the RM shut it down)."""
        for name in self.children():
            await self.destroy(self.cgroup(name))
        for h in self.layout.hierarchies:
            with contextlib.suppress(OSError):
                h.parent.rmdir()

    # ----- one cgroup ------------------------------------------------------------------

    def cgroup(self, name: str, limits: Limits = NO_LIMITS) -> Cgroup:
        """The handle of cgroup `name` (no I/O: it may or may not exist)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"invalid cgroup name {name!r}")
        dirs = tuple((c, h.parent / name) for h in self.layout.hierarchies for c in h.controllers)
        return Cgroup(name, dirs, limits)

    def create(self, name: str, limits: Limits) -> Cgroup:
        """Makes cgroup `name` with `limits` (and the agent's pids limit) in every
        hierarchy; raises OSError, leaving nothing behind."""
        if not limits.pids and self.pids_max:
            limits = Limits(limits.memory_bytes, limits.cpu_millis, self.pids_max)
        cg = self.cgroup(name, limits)
        made: list[Path] = []
        try:
            for directory in cg.directories:
                directory.mkdir()
                made.append(directory)
            for w in limit_writes(self.version, limits):
                path = cg.dir_of(w.controller) / w.file
                if not w.required and not path.exists():
                    continue
                _write(path, w.value)
        except OSError:
            for directory in reversed(made):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise
        return cg

    def join_command(self, cg: Cgroup) -> list[str]:
        """The prefix that puts the process it starts into `cg`, then execs what follows."""
        procs = [str(d / "cgroup.procs") for d in cg.directories]
        return [SH, "-c", JOIN_SCRIPT, "sh", str(len(procs)), *procs]

    def move(self, cg: Cgroup, pid: int) -> None:
        """Moves process `pid` into `cg` (raises OSError)."""
        for directory in cg.directories:
            _write(directory / "cgroup.procs", str(pid))

    def members(self, cg: Cgroup) -> set[int]:
        """The processes in `cg`, in any of its hierarchies."""
        pids: set[int] = set()
        for directory in cg.directories:
            text = _read(directory / "cgroup.procs") or ""
            pids.update(int(p) for p in text.split())
        return pids

    def exists(self, cg: Cgroup) -> bool:
        return any(d.is_dir() for d in cg.directories)

    def sample(self, cg: Cgroup) -> Sample | None:
        """Memory (now and peak), CPU time and OOM kills of `cg` (None: it is gone)."""
        now = time.monotonic()
        memory = cg.dir_of("memory")
        if not memory.is_dir():
            return None
        if self.version == 2:
            cpu = parse_keyed(_read(cg.dir_of("cpu") / "cpu.stat") or "").get("usage_usec", 0)
            events = parse_keyed(_read(memory / "memory.events") or "")
            current = _read_int(memory / "memory.current")
            peak = _read_int(memory / "memory.peak") or current
            return Sample(now, current, peak, cpu, events.get("oom_kill", 0))
        usage_ns = _read_int(cg.dir_of("cpuacct") / "cpuacct.usage")
        control = parse_keyed(_read(memory / "memory.oom_control") or "")
        return Sample(
            now,
            _read_int(memory / "memory.usage_in_bytes"),
            _read_int(memory / "memory.max_usage_in_bytes"),
            usage_ns // 1000,
            control.get("oom_kill", 0),
        )

    async def kill(self, cg: Cgroup, within: float = _KILL_WITHIN_SECONDS) -> bool:
        """Ends every process in `cg`: cgroup.kill on v2 (or freeze, kill, thaw where
        the kernel has none), freeze + kill + thaw on v1, again until it is empty.
        False if something is still in it after `within` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        pause = 0.005
        while self.members(cg):
            if loop.time() >= deadline:
                log.error("cgroup %s: processes %s survived the kill", cg.name, self.members(cg))
                return False
            kill_file = cg.dir_of("memory") / "cgroup.kill"
            if self.version == 2 and kill_file.exists():
                with contextlib.suppress(FileNotFoundError):
                    _write(kill_file, "1")
            else:
                await self._freeze_kill_thaw(cg)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)
        return True

    async def _freeze_kill_thaw(self, cg: Cgroup) -> None:
        if self.version == 2:
            state_file, frozen_value = cg.dir_of("memory") / "cgroup.freeze", ("1", "0")
        else:
            state_file, frozen_value = cg.dir_of("freezer") / "freezer.state", ("FROZEN", "THAWED")
        try:
            _write(state_file, frozen_value[0])
        except FileNotFoundError:
            return
        try:
            await self._until_frozen(cg)
            # Nothing in a frozen cgroup forks: the listing is the whole of it. The
            # kills are pending until the thaw, which lets them land.
            _kill_all(self.members(cg))
        finally:
            with contextlib.suppress(FileNotFoundError):
                _write(state_file, frozen_value[1])

    async def _until_frozen(self, cg: Cgroup) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + _FREEZE_WAIT_SECONDS
        while loop.time() < until:
            if self.version == 2:
                frozen = parse_keyed(_read(cg.dir_of("memory") / "cgroup.events") or "")
                if frozen.get("frozen") == 1:
                    return
            elif (_read(cg.dir_of("freezer") / "freezer.state") or "").strip() == "FROZEN":
                return
            await asyncio.sleep(0.005)
        log.warning(
            "cgroup %s did not freeze within %gs: killing it anyway", cg.name, _FREEZE_WAIT_SECONDS
        )

    def remove(self, cg: Cgroup) -> bool:
        """Removes `cg`'s directories; False if one is still in use."""
        done = True
        for directory in cg.directories:
            try:
                directory.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("cannot remove cgroup %s: %s", directory, exc.strerror)
                done = False
        return done

    async def destroy(self, cg: Cgroup, within: float = _KILL_WITHIN_SECONDS) -> bool:
        """`kill`, then `remove`; True when nothing of `cg` is left."""
        killed = await self.kill(cg, within)
        return self.remove(cg) and killed


def _kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
