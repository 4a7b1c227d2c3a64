"""Root's private places for what others cannot reach in a data directory, and their
removal once that data directory is gone.

Run as root, rm-server keeps what the database's OS user or dev mode's EngineConn users
cannot reach inside a data directory (a checkout under /root, any `mktemp -d`
directory) in that data directory's *home*, `RELOCATED_ROOT/<key>/` (root's, 0711;
`<key>` is derived from the data directory's resolved path): `pgdata/` and `pgsocket/`
(the embedded database), `work/` (dev mode's work root). `<data-dir>/pgdata` and
`<data-dir>/work` are symlinks there.

Each home's `data-dir` file names its owner: the data directory's path, its file handle
(name_to_handle_at(2), the kernel's name for the directory itself, as NFS servers use
it: a rename keeps it valid, and once the directory is deleted it is stale for good,
even if another directory takes the same path or inode number) and the rm-server that
last started on it. A home whose data directory was deleted is an *orphan*: every
rm-server started as root removes the orphans first (`remove_orphans`), so deleting a
data directory is all it takes to start afresh, and nothing is left behind. A home is
kept whenever its owner cannot be shown deleted: the directory still exists (moved or
not), its path links to the home (a backup restored), its rm-server still runs, the file
system is not mounted or has no file handles, or an older rm-server wrote the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import signal
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

RELOCATED_ROOT = Path("/var/lib/labelrm/embedded")
OWNER_FILE = "data-dir"
LINKS = ("pgdata", "work")  # the names in a data directory that may link to its home
_LOCK_FILE = ".lock"  # held while homes are claimed or removed (rm-servers start together)
_MAX_HANDLE_BYTES = 128  # MAX_HANDLE_SZ
_STOP_WAIT = 30.0  # seconds for a leftover server of an orphan to stop


class EmbeddedDatabaseError(Exception):
    """The embedded database cannot be started safely (one line for the operator)."""


def data_dir_key(data_dir: Path) -> str:
    """A name for a data directory (a resolved path) in root's places for what others
    cannot reach inside it: the first 128 bits of the path's SHA-256 (short enough
    for the database's socket path)."""
    return hashlib.sha256(str(data_dir).encode()).hexdigest()[:32]


def relocated_home(data_dir: Path) -> Path:
    """Root's private place for what others cannot reach in `data_dir` (module doc)."""
    return RELOCATED_ROOT / data_dir_key(data_dir)


# ----- the owner of a home ----------------------------------------------------------------


class Existence(Enum):
    LIVE = "live"  # the directory exists (at its path or elsewhere)
    DELETED = "deleted"
    UNKNOWN = "unknown"  # no handle, no file handles here, or its file system not mounted


@dataclass(frozen=True)
class Owner:
    """What a home's `data-dir` file says (module doc); -1 / empty / 0: not recorded."""

    data_dir: Path
    device: int = -1
    handle_type: int = -1
    handle: bytes = b""
    rm_pid: int = 0
    rm_started: float = 0.0

    @classmethod
    def of(cls, data_dir: Path) -> Owner:
        """`data_dir` (which exists) with its handle, as owned by this rm-server."""
        handle_type, handle = directory_handle(data_dir) or (-1, b"")
        return cls(
            data_dir,
            data_dir.stat().st_dev,
            handle_type,
            handle,
            os.getpid(),
            psutil.Process().create_time(),
        )

    def render(self) -> str:
        """The file's text: the path first (for operators), then `key=value` lines."""
        return (
            f"{self.data_dir}\ndevice={self.device}\n"
            f"handle={self.handle_type}:{self.handle.hex()}\n"
            f"rm_pid={self.rm_pid}\nrm_started={self.rm_started!r}\n"
        )

    @classmethod
    def parse(cls, text: str) -> Owner:
        """The owner a file says (an older rm-server's holds the path alone)."""
        first, *rest = text.splitlines() or [""]
        fields = dict(line.partition("=")[::2] for line in rest)
        try:
            handle_type, _, handle = fields.get("handle", "-1:").partition(":")
            return cls(
                Path(first),
                int(fields.get("device", -1)),
                int(handle_type),
                bytes.fromhex(handle),
                int(fields.get("rm_pid", 0)),
                float(fields.get("rm_started", 0.0)),
            )
        except ValueError:
            return cls(Path(first))

    def rm_running(self) -> bool:
        """Whether the rm-server that wrote this still runs (its pid, with the same
        start time: a pid the kernel gave to another process does not count, nor a
        killed one its parent has not reaped)."""
        if self.rm_pid <= 0:
            return False
        try:
            process = psutil.Process(self.rm_pid)
            started = float(process.create_time())
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            return False
        return abs(started - self.rm_started) < 0.01

    def existence(self) -> tuple[Existence, Path | None]:
        """Whether the data directory still exists, and where it is now if it does."""
        if not self.handle:
            return Existence.UNKNOWN, None
        # open_by_handle_at needs any directory of the same file system: the nearest
        # one still there on the path. On another device: the file system is not mounted.
        anchor = next((p for p in (self.data_dir, *self.data_dir.parents) if p.exists()), None)
        if anchor is None or anchor.stat().st_dev != self.device:
            return Existence.UNKNOWN, None
        try:
            current = path_of_handle(anchor, self.handle_type, self.handle)
        except OSError as exc:
            gone = exc.errno == errno.ESTALE
            return (Existence.DELETED if gone else Existence.UNKNOWN), None
        return Existence.LIVE, current


def read_owner(home: Path) -> Owner | None:
    """The owner of `home` (None: no home there, or no `data-dir` file in it)."""
    try:
        return Owner.parse((home / OWNER_FILE).read_text())
    except (OSError, UnicodeDecodeError):
        return None


# ----- file handles (name_to_handle_at(2), open_by_handle_at(2)) -------------------------


class _FileHandle(ctypes.Structure):
    _fields_ = [
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * _MAX_HANDLE_BYTES),
    ]


@functools.cache
def _libc_call(name: str) -> Callable[..., int] | None:
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (AttributeError, OSError):
        return None
    return function


def directory_handle(path: Path) -> tuple[int, bytes] | None:
    """The file handle of directory `path` (type, bytes); None where the file system
    or the C library has none (then a home is never judged an orphan)."""
    call = _libc_call("name_to_handle_at")
    if call is None:
        return None
    handle = _FileHandle(handle_bytes=_MAX_HANDLE_BYTES)
    mount_id = ctypes.c_int()
    at_fdcwd = -100
    if call(at_fdcwd, os.fsencode(path), ctypes.byref(handle), ctypes.byref(mount_id), 0) != 0:
        return None
    return handle.handle_type, bytes(handle.f_handle[: handle.handle_bytes])


def path_of_handle(anchor: Path, handle_type: int, data: bytes) -> Path:
    """Where the directory of a handle is now (OSError: ESTALE once it is deleted, even
    while a process still has it open); `anchor` is any directory of its file system.
    Needs CAP_DAC_READ_SEARCH (root)."""
    call = _libc_call("open_by_handle_at")
    if call is None or len(data) > _MAX_HANDLE_BYTES:
        raise OSError(errno.EOPNOTSUPP, "no open_by_handle_at")
    handle = _FileHandle(handle_bytes=len(data), handle_type=handle_type)
    ctypes.memmove(handle.f_handle, data, len(data))
    mount_fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = call(mount_fd, ctypes.byref(handle), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
    finally:
        os.close(mount_fd)
    try:
        if os.fstat(fd).st_nlink == 0:  # deleted, but a process still has it open
            raise OSError(errno.ESTALE, "deleted")
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)


# ----- claiming homes and removing orphans -------------------------------------------------


@contextlib.contextmanager
def _homes_locked() -> Iterator[None]:
    """RELOCATED_ROOT's lock: one rm-server at a time claims or removes homes, so none
    removes a home another is just making its own."""
    fd = os.open(
        RELOCATED_ROOT / _LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim_home(data_dir: Path, tolerated_uid: int = 0) -> Path:
    """`data_dir`'s home (module doc), made if missing (root's, 0711), its `data-dir`
    file naming `data_dir` and this rm-server. Orphans are removed first, the home of an
    earlier data directory deleted at this very path among them. Refused while another
    rm-server still runs on it (its data directory deleted and made again meanwhile).
    A home of `tolerated_uid`'s (the database user's, as earlier versions made it) is
    given back to root."""
    make_root_dir(RELOCATED_ROOT.parent)
    make_root_dir(RELOCATED_ROOT)
    with _homes_locked():
        _remove_orphans()
        home = relocated_home(data_dir)
        earlier = read_owner(home)
        if earlier is not None and earlier.rm_pid != os.getpid() and earlier.rm_running():
            raise EmbeddedDatabaseError(
                f"{home} is in use by rm-server pid {earlier.rm_pid}, started on an earlier "
                f"{earlier.data_dir} deleted since: stop that rm-server first"
            )
        check_not_moved(home, data_dir)
        # Root's, searchable but not listable: the database user owns only pgdata/ and
        # pgsocket/ in it and cannot swap them.
        home.mkdir(mode=0o711, exist_ok=True)
        st = home.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, tolerated_uid):
            raise EmbeddedDatabaseError(f"{home} is not a directory of root's; remove it")
        os.chown(home, 0, 0, follow_symlinks=False)  # earlier versions gave it away
        home.chmod(0o711)
        write_new(home / OWNER_FILE, Owner.of(data_dir).render(), 0o644)
        return home


def check_not_moved(home: Path, data_dir: Path) -> None:
    """EmbeddedDatabaseError if `home` is what rm-server kept for a directory that
    was at `data_dir` and is elsewhere now (moved: its files are not this one's)."""
    owner = read_owner(home)
    if owner is None:
        return
    existence, now = owner.existence()
    if existence is Existence.LIVE and now is not None and now != data_dir:
        raise EmbeddedDatabaseError(
            f"{home} holds what rm-server kept for {owner.data_dir}, moved to {now} since: "
            "move that directory back, or delete it to start afresh here"
        )


def remove_orphans() -> list[Path]:
    """Remove every home whose data directory was deleted (module doc); returns them."""
    if not RELOCATED_ROOT.is_dir():
        return []
    with _homes_locked():
        return _remove_orphans()


def _remove_orphans() -> list[Path]:
    removed = []
    for home in sorted(RELOCATED_ROOT.iterdir()):
        if home.name.startswith(".") or home.is_symlink() or not home.is_dir():
            continue
        owner = read_owner(home)
        if owner is None or not _is_orphan(home, owner):
            continue
        if not _stop_leftover_server(home / "pgdata"):
            continue
        shutil.rmtree(home, ignore_errors=True)
        log.warning("removed %s: what rm-server kept for %s, deleted since", home, owner.data_dir)
        removed.append(home)
    return removed


def _is_orphan(home: Path, owner: Owner) -> bool:
    if owner.rm_running() or owner.existence()[0] is not Existence.DELETED:
        return False
    # A data directory made again at the path, linking here (a backup restored): kept.
    for name in LINKS:
        link = owner.data_dir / name
        with contextlib.suppress(OSError):
            if link.is_symlink() and Path(os.readlink(link)).parent == home:
                return False
    return True


def _stop_leftover_server(pgdata: Path) -> bool:
    """No PostgreSQL left running on `pgdata` (one of a killed rm-server is stopped,
    as a fast shutdown); False if it would not stop."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        postmaster = psutil.Process(pid)
        if postmaster.status() == psutil.STATUS_ZOMBIE or Path(postmaster.cwd()) != pgdata:
            return True
    except (OSError, ValueError, psutil.Error):
        return True
    log.warning("stopping the PostgreSQL left running on %s (pid %d)", pgdata, pid)
    with contextlib.suppress(psutil.Error):
        postmaster.send_signal(signal.SIGINT)
        deadline = time.monotonic() + _STOP_WAIT
        while postmaster.is_running() and postmaster.status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() > deadline:
                log.error("the PostgreSQL on %s (pid %d) did not stop; kept", pgdata, pid)
                return False
            time.sleep(0.1)
    return True


# ----- root's directories and files --------------------------------------------------------


def make_root_dir(path: Path) -> None:
    """`path` as a directory of root's that everyone can search and only root can
    write (mode 0755 whatever the umask; an existing one is checked, never changed:
    anyone else able to write there could swap the database's files)."""
    for missing in [p for p in (*reversed(path.parents), path) if not p.exists()]:
        try:
            missing.mkdir()
        except FileExistsError:  # another rm-server made it meanwhile: checked below
            continue
        missing.chmod(0o755)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or (st.st_mode & 0o023) != 0o001:
        raise EmbeddedDatabaseError(
            f"{path} must be a directory of root's that everyone can search and only root "
            f"can write (it is {stat.filemode(st.st_mode)}, uid {st.st_uid})"
        )


def write_new(
    path: Path, text: str, mode: int = 0o600, owner: tuple[int, int] | None = None
) -> None:
    """`path` replaced by a new file of ours holding `text`: unlinked, then created
    exclusively without following links (one planted there is not written through)."""
    path.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        raise EmbeddedDatabaseError(f"{path} keeps reappearing; is a server running?") from None
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), mode)
        if owner is not None and owner[0] != os.geteuid():
            os.fchown(out.fileno(), *owner)
        out.write(text)
