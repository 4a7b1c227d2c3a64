"""Stops a test session's embedded PostgreSQL when the session's process is gone, however
it went (Ctrl-C, a kill, a crash), and removes its directory.

    python -m tests.reaper <pid> <pgdata> <directory>

The database runs detached (pg_ctl starts it in a session of its own), so nothing else
would stop it: an interrupted test run used to leave it behind. The session's own
teardown stops it first in the usual case; the reaper then finds nothing to do."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import time
from pathlib import Path


def wait_for_exit(pid: int) -> None:
    """Return once process `pid` has ended (a pidfd becomes readable when it does)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def stop_postgres(pgdata: Path, grace: float = 10.0) -> None:
    """An immediate shutdown (SIGQUIT to the postmaster: it takes its backends with it);
    SIGKILL if it is still there after `grace` seconds."""
    pid = postmaster_pid(pgdata)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> None:
    pid, pgdata, directory = int(argv[0]), Path(argv[1]), Path(argv[2])
    wait_for_exit(pid)
    stop_postgres(pgdata)
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
