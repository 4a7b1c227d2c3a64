"""The work directory of a launch, created safely as root for its user:
``<work_root>/<user>/<yyyymmdd>/<engine>/<ec_id>/`` with ``logs/``, ``tmp/``, the
material files and the root-owned ``launch.sh``, built through directory file
descriptors with ``O_NOFOLLOW`` so a user's symlink cannot redirect root; and the
reading of its log tails on the same terms."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import shlex
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from ecm_agent.validate import (
    ENV_NAME_RE,
    SECRET_ENV,
    SECRET_FILE,
    SECRET_FILE_ENV,
    AgentPolicy,
    LaunchRefused,
    LaunchSpec,
    ValidatedLaunch,
)

LAUNCH_SCRIPT = "launch.sh"
LOG_TAIL_BYTES = 4096
_TAIL_READ_BYTES = 64 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class PreparedWorkDir(NamedTuple):
    """The created work directory and an open append fd on ``logs/launcher.log``."""

    path: Path
    launcher_log_fd: int


def work_dir_for(policy: AgentPolicy, spec: LaunchSpec, today: dt.date) -> Path:
    """``<work_root>/<user>/<yyyymmdd>/<engine>/<ec_id>`` (no I/O, no validation)."""
    return policy.work_root / spec.user / today.strftime("%Y%m%d") / spec.engine / spec.ec_id


def launch_environment(validated: ValidatedLaunch, work_dir: Path) -> dict[str, str]:
    """The variables the launch script exports: the request's and the required
    local ones (already validated) plus the agent's own. The executor's secret is not
    among them: only the path of the file that holds it (`prepare_work_dir`)."""
    env = dict(validated.environment)
    if env.pop(SECRET_ENV, None) is not None:
        env[SECRET_FILE_ENV] = str(work_dir / SECRET_FILE)
    env["LABELRM_EC_ID"] = validated.spec.ec_id
    env["TMPDIR"] = str(work_dir / "tmp")
    return env


def render_launch_script(
    *,
    work_dir: Path,
    program_path: str,
    argv: Sequence[str],
    environment: Mapping[str, str],
    keep_stdout: bool = False,
) -> str:
    """The bash launch script. Every value is passed through ``shlex.quote``;
    names are checked again here so this function is safe on its own.

    ``keep_stdout``: stdout stays what sudo was given (a fork server's pipe to the
    agent) instead of going to ``logs/stdout.log``."""
    lines = [
        "#!/bin/bash",
        "# Written by the labelrm ECM agent; runs as the EngineConn's user.",
        "set -euo pipefail",
        # Files the EngineConn creates are not readable by other users.
        "umask 0027",
        f"cd -- {shlex.quote(str(work_dir))}",
    ]
    for name, value in environment.items():
        if not ENV_NAME_RE.fullmatch(name):
            raise ValueError(f"invalid variable name {name!r}")
        if "\0" in value:
            raise ValueError(f"NUL byte in the value of {name}")
        lines.append(f"export {name}={shlex.quote(value)}")
    words = [shlex.quote(program_path)]
    for arg in argv:
        if "\0" in arg:
            raise ValueError("NUL byte in argv")
        words.append(shlex.quote(arg))
    out = "" if keep_stdout else " >>logs/stdout.log"
    lines.append(f"exec {' '.join(words)}{out} 2>>logs/stderr.log")
    return "\n".join(lines) + "\n"


def _open_dir(parent_fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LaunchRefused("work_dir", f"{name!r} is a symlink or not a directory") from None
        raise


def _ensure_dir(parent_fd: int, name: str, mode: int, uid: int, gid: int) -> int:
    """Open (creating if missing) a directory that the agent or the user may own. One
    this call created and could not set up is removed again: a failed launch leaves
    nothing that later launches would trip over."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        created = True
    except FileExistsError:
        created = False
    try:
        fd = _open_dir(parent_fd, name)
    except BaseException:
        if created:
            os.rmdir(name, dir_fd=parent_fd)
        raise
    try:
        if created:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        elif os.fstat(fd).st_uid not in (os.geteuid(), uid):
            raise LaunchRefused("work_dir", f"{name!r} exists and belongs to another user")
    except BaseException:
        os.close(fd)
        if created:
            os.rmdir(name, dir_fd=parent_fd)
        raise
    return fd


def _write_new(dir_fd: int, name: str, content: bytes, mode: int, uid: int, gid: int) -> None:
    # O_EXCL | O_NOFOLLOW: never write through something that was already there.
    fd = os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def prepare_work_dir(
    policy: AgentPolicy, validated: ValidatedLaunch, today: dt.date, *, keep_stdout: bool = False
) -> PreparedWorkDir:
    """Create the work directory with ``logs/``, ``tmp/``, the material files and
    ``launch.sh``; return its real path and an open fd on ``logs/launcher.log``.

    Parents are the agent's (root's), 0755, except ``<work_root>/<user>`` (the
    user's, 0750); the EngineConn directory and its contents belong to the user,
    except ``launch.sh`` (the agent's, 0644); material files and the executor's secret
    file are the user's alone (0600, 0700 if executable). Raises :class:`LaunchRefused`
    on symlink tricks or an EngineConn directory that already exists; on failure
    nothing is left behind.
    """
    spec = validated.spec
    uid, gid = validated.uid, validated.gid
    os.makedirs(policy.work_root, mode=0o755, exist_ok=True)
    root = Path(os.path.realpath(policy.work_root))
    day = today.strftime("%Y%m%d")
    work_dir = root / spec.user / day / spec.engine / spec.ec_id
    script = render_launch_script(
        work_dir=work_dir,
        program_path=validated.program_path,
        argv=spec.argv,
        environment=launch_environment(validated, work_dir),
        keep_stdout=keep_stdout,
    )
    with contextlib.ExitStack() as fds:

        def hold(fd: int) -> int:
            fds.callback(os.close, fd)
            return fd

        # The agent's own: root's, or, for an agent run by a user for themselves (dev
        # mode), that user's (who cannot hand anything to root).
        me, my_group = os.geteuid(), os.getegid()
        root_fd = hold(os.open(root, _DIR_FLAGS))
        user_fd = hold(_ensure_dir(root_fd, spec.user, 0o750, uid, gid))
        day_fd = hold(_ensure_dir(user_fd, day, 0o755, me, my_group))
        engine_fd = hold(_ensure_dir(day_fd, spec.engine, 0o755, me, my_group))
        try:
            os.mkdir(spec.ec_id, 0o700, dir_fd=engine_fd)
        except FileExistsError:
            raise LaunchRefused("ec_id", f"work directory {work_dir} already exists") from None
        try:
            # Everything is created while the directory is still root's 0700, and
            # handed to the user last, so the user cannot race any of these steps.
            ec_fd = hold(_open_dir(engine_fd, spec.ec_id))
            for sub in ("logs", "tmp"):
                os.mkdir(sub, 0o700, dir_fd=ec_fd)
            logs_fd = hold(_open_dir(ec_fd, "logs"))
            tmp_fd = hold(_open_dir(ec_fd, "tmp"))
            for material in spec.material_files:
                # The user's alone: they include the EngineConn's private key.
                mode = 0o700 if material.executable else 0o600
                _write_new(ec_fd, material.name, material.content, mode, uid, gid)
            secret = validated.environment.get(SECRET_ENV)
            if secret is not None:
                _write_new(ec_fd, SECRET_FILE, secret.encode("utf-8"), 0o600, uid, gid)
            _write_new(ec_fd, LAUNCH_SCRIPT, script.encode("utf-8"), 0o644, me, my_group)
            log_fd = os.open("launcher.log", _NEW_FILE_FLAGS | os.O_APPEND, 0o600, dir_fd=logs_fd)
            try:
                os.fchown(log_fd, uid, gid)
                os.fchmod(log_fd, 0o640)
                for fd, mode in ((logs_fd, 0o750), (tmp_fd, 0o700), (ec_fd, 0o750)):
                    os.fchown(fd, uid, gid)
                    os.fchmod(fd, mode)
                _verify_under(root, work_dir)
            except BaseException:
                os.close(log_fd)
                raise
        except BaseException:
            # rmtree relative to the engine dir fd: never follows a swapped path.
            shutil.rmtree(spec.ec_id, ignore_errors=True, dir_fd=engine_fd)
            raise
    return PreparedWorkDir(work_dir, log_fd)


def _verify_under(root: Path, work_dir: Path) -> None:
    real = os.path.realpath(work_dir)
    if real != str(work_dir) or os.path.commonpath([str(root), real]) != str(root):
        raise LaunchRefused("work_dir", f"{work_dir} resolves to {real}, outside the work root")


def read_tail(root: Path, work_dir: Path, name: str, uid: int) -> bytes:
    """The last bytes of ``<work_dir>/logs/<name>`` if it is a regular file owned
    by the user (root must not read what a user's symlink or hard link points at)."""
    try:
        rel = work_dir.relative_to(root)
    except ValueError:
        return b""
    with contextlib.ExitStack() as fds:
        try:
            fd = os.open(root, _DIR_FLAGS)
            fds.callback(os.close, fd)
            for part in (*rel.parts, "logs"):
                fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                fds.callback(os.close, fd)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(name, flags, dir_fd=fd)
            fds.callback(os.close, fd)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
                return b""
            os.lseek(fd, max(0, info.st_size - _TAIL_READ_BYTES), os.SEEK_SET)
            return os.read(fd, _TAIL_READ_BYTES)
        except OSError:
            return b""


def tail_text(data: bytes, lines: int) -> str:
    kept = b"\n".join(data.rstrip(b"\n").split(b"\n")[-lines:]) if lines > 0 else b""
    return kept[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")
