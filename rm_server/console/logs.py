"""Following an EngineConn's logs from the RM's host: what was appended to
``<work_dir>/logs/{stdout,stderr,launcher}.log`` since the offsets a page last read.

The files are on the ECM's host. They are readable here when the RM runs there too (one
host, dev mode) and may read them; otherwise the page shows the tail the RM kept and says
where the files are (as ``rmctl engineconn logs`` does).

The RM may run as root while the directory belongs to the EngineConn's user: every
directory from ``/`` down is opened with O_NOFOLLOW (a user's symlink cannot redirect
the read), and only regular files owned by that user, in a ``logs`` directory owned by
that user, are read (no other user's file through a link). Each read is bounded."""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

LOG_FILES = ("stdout.log", "stderr.log", "launcher.log")
MOST_BYTES = 64 * 1024  # per file and read: a page catches up over several polls
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def uid_of(user: str) -> int | None:
    """The user's id on this host (None: no such user here)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def read_new(
    work_dir: str, uid: int, offsets: Mapping[str, int], most: int = MOST_BYTES
) -> dict[str, dict[str, Any]] | None:
    """Per log file: ``{"from": offset, "to": next offset, "size": its size, "text": ...}``
    for what lies after `offsets` (an absent name: the last `most` bytes; an offset past
    the end: the file was replaced, read it from 0). None when the directory is not on
    this host or not the user's."""
    path = PurePosixPath(work_dir)
    if not path.is_absolute() or ".." in path.parts:
        return None
    with contextlib.ExitStack() as fds:
        try:
            fd = os.open("/", _DIR)
            fds.callback(os.close, fd)
            for part in (*path.parts[1:], "logs"):
                fd = os.open(part, _DIR, dir_fd=fd)
                fds.callback(os.close, fd)
        except OSError:
            return None
        if os.fstat(fd).st_uid != uid:
            return None
        out = {}
        for name in LOG_FILES:
            chunk = _read(fd, name, uid, offsets.get(name), most)
            if chunk is not None:
                out[name] = chunk
        return out


def _read(dir_fd: int, name: str, uid: int, offset: int | None, most: int) -> dict[str, Any] | None:
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError:
        return None  # not written yet, or a link
    with contextlib.closing(os.fdopen(fd, "rb")) as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            return None
        size = info.st_size
        start = max(0, size - most) if offset is None else (0 if offset > size else offset)
        fh.seek(start)
        data = fh.read(min(most, size - start))
    text, used = _decode(data)
    return {"from": start, "to": start + used, "size": size, "text": text}


def _decode(data: bytes) -> tuple[str, int]:
    """`data` as text and how many of its bytes that is: a character cut at the end of a
    read is left for the next one."""
    for cut in range(min(3, len(data)) + 1):
        try:
            return data[: len(data) - cut].decode("utf-8"), len(data) - cut
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", "replace"), len(data)
