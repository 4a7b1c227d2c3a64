"""EngineConn processes as /proc shows them: who they are (pid and start time, so that a
reused pid is never mistaken for them), their process group, and waiting for them to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

_POLL_SECONDS = 0.05
_REAP_WAIT_SECONDS = 0.02
_REATTACHED_POLL_SECONDS = 0.2


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
    # Its cgroup's name under the agent's parent ("": not contained).
    cgroup: str = ""

    @property
    def engine_conn_pid(self) -> int:
        """The pid the EngineConn runs as (what the RM reports); `pid` stays the one
        the agent waits on and whose group it signals."""
        return self.main_pid or self.pid


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
