"""Replacing a configuration file in place without changing who may read it.

The RM runs as its own user (``User=labelrm`` in the shipped unit) while operators edit its
token file and certificates as root. A rewrite that left the file ``root:root 0600`` would
lock the RM out of it: the RM then keeps its previous table, so a revoked token would keep
working. Every rewrite therefore keeps the owner, group and mode of the file it replaces.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

__all__ = ["replace_file"]


def replace_file(path: Path, data: bytes, new_mode: int = 0o600) -> None:
    """Atomically replace `path` with `data` (a reader sees the old or the new file).

    An existing file keeps its owner, group and permission bits; a new one is created with
    `new_mode` (whatever the umask), owned by the caller. The data is written to a temporary
    file beside it, given the ownership and mode before any byte is written, synced, and
    renamed over the old one. Raises PermissionError naming the file when the caller cannot
    give the new file the old one's owner (only root can give a file away).
    """
    if not path.parent.is_dir():
        # Said here: the temporary file beside it would be what the error names.
        raise FileNotFoundError(
            errno.ENOENT, "no such directory (create it first)", str(path.parent)
        )
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            if old is not None:
                if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                    os.fchown(fd, old.st_uid, old.st_gid)
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
            else:
                os.fchmod(fd, new_mode)
        except PermissionError:
            raise PermissionError(
                f"cannot keep the owner of {path} (uid {old.st_uid if old else '?'}, gid "
                f"{old.st_gid if old else '?'}): run this as root or as that user"
            ) from None
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
