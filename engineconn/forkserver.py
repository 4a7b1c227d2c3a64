"""The fork server: one warm interpreter per user that starts the user's EngineConns by
forking.

``python -m engineconn --fork-server``. The ECM agent starts it like an EngineConn (through
sudo, as the user, by a root-owned launch.sh in a work directory of its own), except that
stdin and stdout stay pipes to the agent. It imports everything an EngineConn needs once;
then, for each launch the agent sends, it forks a child that becomes that EngineConn the
way launch.sh would have started it: a session and process group of its own, the
EngineConn's work directory, umask 0027, stdin /dev/null, stdout and stderr appended to
``logs/stdout.log`` and ``logs/stderr.log``, the launch's environment and arguments. A
launch then costs a fork instead of sudo, bash and a cold interpreter (the imports alone
are most of an EngineConn's start-up CPU).

Nothing here is privileged: the server runs as its user and can do only what that user can
do. The agent trusts none of its answers (``ecm_agent/forkserver.py``: every pid is checked
in /proc, an exit is believed only once the kernel says the process is gone).

The protocol, one JSON object per line, is ``labelrm_common/forkserver_wire.py``: the
agent's Spawn and Go, this server's Ready (once, everything imported), Spawned, Failed
and Exit.

A held child has done its set-up (session, directory, log files) but runs none of the
EngineConn until its "go": the agent puts it into the EngineConn's cgroup in between, so
nothing the EngineConn starts runs outside it. A held child whose "go" never comes (the
agent or this server went away) exits 127.

At the end of its stdin it starts nothing more, releases no held child, and exits once its
last child has ended.

A child shares what the server made before forking, including the interpreter's hash seed
(str hashes are randomised per server, not per EngineConn); ``random`` is re-seeded by the
fork itself, and secrets come from the kernel (``os.urandom``).
"""

from __future__ import annotations

import gc
import os
import select
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from labelrm_common import forkserver_wire as wire

#: A request line longer than this is an error (launches are bounded far below it).
MAX_LINE_BYTES = 8 * 1024 * 1024
#: A child that has not finished its set-up (cd, log files) by then is killed (and
#: reported failed before the agent gives up on this server, after 5 s).
SETUP_TIMEOUT_SECONDS = 3.0
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK


def _preload() -> None:
    """Imports everything an EngineConn imports on its way to ready (and a few more)."""
    import asyncio.subprocess  # noqa: F401 - the shell engine's executions
    import ctypes  # noqa: F401 - the process title of a child; the python engine's cancel
    import logging.handlers  # noqa: F401
    import traceback  # noqa: F401

    import tenacity  # noqa: F401 - the runtime's retries when the RM is away

    import engineconn.runtime  # noqa: F401 - grpc, protobuf, the stubs, asyncio
    from engineconn.engines import ENGINES, load_engine
    from engineconn.settings import ENGINECONN

    for name in ENGINES:
        load_engine(name)
    # The command line's parser (and argparse's help formatter, which imports shutil):
    # built once here, it was a sixth of a forked EngineConn's CPU.
    ENGINECONN.parser  # noqa: B018 - a cached property, built now


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


class _Server:
    def __init__(self, ctl_in: int, ctl_out: int) -> None:
        self.ctl_in = ctl_in
        self.ctl_out = ctl_out
        self.listening = True  # False once the agent has gone (EPIPE)
        self.base_env = dict(os.environ)
        self.start_dir = os.getcwd()
        self.children: dict[int, str] = {}
        self.held: dict[int, int] = {}  # held child -> the write end of its "go" pipe
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # ----- talking to the agent ---------------------------------------------------------

    def send(self, message: wire.Reply) -> None:
        if not self.listening:
            return
        data = memoryview(wire.encode(message))
        try:
            while data:
                data = data[os.write(self.ctl_out, data) :]
        except OSError:  # the agent is gone: go on reaping, say nothing more
            self.listening = False

    def run(self) -> int:
        signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
        signal.set_wakeup_fd(self.wake_w)  # SIGCHLD wakes the poll below
        poller = select.poll()
        poller.register(self.ctl_in, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        buffer = bytearray()
        reading = True
        self.send(wire.Ready(os.getpid(), hold=True))
        while reading or self.children:
            for fd, _ in poller.poll():
                if fd == self.wake_r:
                    _drain(self.wake_r)
                    continue
                data = os.read(self.ctl_in, 1 << 16)
                if not data:
                    reading = False
                    poller.unregister(self.ctl_in)
                    self.release_held()
                    continue
                buffer += data
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    self.handle(line)
                if len(buffer) > MAX_LINE_BYTES:
                    print("fork server: request line too long; stopping", file=sys.stderr)
                    reading = False
                    poller.unregister(self.ctl_in)
            self.reap()
        return 0

    def handle(self, line: bytes) -> None:
        try:
            request = wire.decode_request(line)
        except wire.WireError as exc:
            print(f"fork server: bad request: {exc}", file=sys.stderr)
            self.send(wire.Failed("", f"bad request: {exc}"))
            return
        if isinstance(request, wire.Go):
            self.go(request.pid)
        else:
            self.spawn(request.ec_id, request.cwd, request.argv, request.env, request.hold)

    def go(self, pid: int) -> None:
        """Lets held child `pid` run (the agent has contained it)."""
        go_w = self.held.pop(pid, None)
        if go_w is None:
            print(f"fork server: no held child {pid!r} to release", file=sys.stderr)
            return
        with _suppress_os_error():
            os.write(go_w, b"g")
        os.close(go_w)

    def release_held(self) -> None:
        """The agent has gone: held children get EOF instead of their "go" (and exit)."""
        for go_w in self.held.values():
            os.close(go_w)
        self.held.clear()

    # ----- children ------------------------------------------------------------------

    def spawn(
        self, ec_id: str, cwd: str, argv: Sequence[str], env: Mapping[str, str], hold: bool
    ) -> None:
        status_r, status_w = os.pipe()  # the child's set-up result: EOF alone means success
        go_r, go_w = os.pipe() if hold else (-1, -1)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(status_r)
                if hold:
                    os.close(go_w)
                self._become(cwd, argv, env, status_w, go_r)
            finally:
                os._exit(127)
        os.close(status_w)
        if hold:
            os.close(go_r)
            self.held[pid] = go_w
        self.children[pid] = ec_id
        try:
            error = _read_status(status_r)
        finally:
            os.close(status_r)
        if error is None:
            os.kill(pid, signal.SIGKILL)
            error = f"set-up did not finish within {SETUP_TIMEOUT_SECONDS:g} s"
        if error:
            self.send(wire.Failed(ec_id, error))
        else:
            self.send(wire.Spawned(ec_id, pid))

    def reap(self) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.pop(pid, None)
            go_w = self.held.pop(pid, None)
            if go_w is not None:
                os.close(go_w)
            cpu_ms = round((usage.ru_utime + usage.ru_stime) * 1000, 1)
            self.send(wire.Exit(pid, status, cpu_ms))

    def _become(
        self, cwd: str, argv: Sequence[str], env: Mapping[str, str], status_w: int, go_r: int
    ) -> NoReturn:
        """In the child: turn into the EngineConn of the request, as launch.sh would
        (held: once the agent says go)."""
        try:
            os.setsid()  # own session and process group: the agent's kill reaches all of it
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            # The other held children's "go" pipes are theirs, not this one's to keep.
            for fd in (self.ctl_in, self.ctl_out, self.wake_r, self.wake_w, *self.held.values()):
                os.close(fd)
            os.chdir(cwd)
            os.umask(0o027)
            # O_NONBLOCK only for the open: a FIFO put there must fail, not hang us.
            out = os.open("logs/stdout.log", _LOG_FLAGS, 0o666)
            err = os.open("logs/stderr.log", _LOG_FLAGS, 0o666)
            for fd, target in ((out, 1), (err, 2)):
                os.set_blocking(fd, True)
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(self.base_env)
            os.environ.update(env)
            os.environ["PWD"] = cwd
            sys.argv = [sys.argv[0], *argv]
            if sys.path and sys.path[0] == self.start_dir:
                sys.path[0] = cwd  # `python -m` puts the start directory first
            import importlib

            importlib.invalidate_caches()
            tempfile: Any = sys.modules.get("tempfile")
            if tempfile is not None:
                tempfile.tempdir = None  # TMPDIR is the EngineConn's now
        except BaseException as exc:
            with _suppress_os_error():
                os.write(status_w, f"{type(exc).__name__}: {exc}".encode()[:4000] or b"?")
            os._exit(127)
        os.close(status_w)
        if go_r >= 0 and not _wait_for_go(go_r):
            os._exit(127)  # never released: nothing of the EngineConn ran
        _set_title(argv)
        code = _run_engineconn(list(argv))
        for stream in (sys.stdout, sys.stderr):
            with _suppress_os_error():
                stream.flush()
        os._exit(code)


class _suppress_os_error:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return isinstance(exc, (OSError, ValueError))


def _set_title(argv: Sequence[str]) -> None:
    """What `ps` shows for the child: `engineconn --ec-id ID ...` instead of the server's
    command line, written over the server's argv (so at most as long as that; the rest
    is cut). Best effort: /proc/self/stat says where the argv area is."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49: arg_start, arg_end
        size = end - start
        if start <= 0 or not 0 < size <= 1 << 16:
            return
        title = " ".join(["engineconn", *argv]).encode("utf-8", "replace")[: size - 1]
        import ctypes

        ctypes.memmove(start, title + b"\0" * (size - len(title)), size)
    except (OSError, ValueError, IndexError):
        pass


def _wait_for_go(go_r: int) -> bool:
    """Blocks until the agent's "go" (True) or the end of the pipe (False)."""
    while True:
        try:
            data = os.read(go_r, 1)
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            continue
        os.close(go_r)
        return bool(data)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _read_status(fd: int) -> str | None:
    """The child's set-up error ("" for success); None if it did not finish in time."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    chunks: list[bytes] = []
    while True:
        if not poller.poll(SETUP_TIMEOUT_SECONDS * 1000):
            return None
        data = os.read(fd, 4096)
        if not data:
            return b"".join(chunks).decode("utf-8", "replace")
        chunks.append(data)


def _run_engineconn(argv: list[str]) -> int:
    """`python -m engineconn ARGV` in this process; its exit code."""
    try:
        if "--version" in argv:
            from engineconn import __version__

            print(f"engineconn {__version__}")
            return 0
        from engineconn.runtime import main

        return _exit_code(main(argv))
    except SystemExit as exc:
        return _exit_code(exc.code)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    finally:
        import logging

        logging.shutdown()


def _exit_code(code: object) -> int:
    """What the interpreter makes of `raise SystemExit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def serve() -> int:
    """Entry point of `python -m engineconn --fork-server`."""
    # The pipes to the agent move out of the way of stdin / stdout: a child gets
    # /dev/null and its log files there, and nothing stray reaches the agent.
    ctl_in, ctl_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    try:
        _preload()
    except Exception as exc:
        print(f"fork server: cannot load the EngineConn runtime: {exc!r}", file=sys.stderr)
        return 1
    if _thread_count() != 1:
        # Forking a process with threads copies only the forking one: never do that.
        print("fork server: threads were started while importing; exiting", file=sys.stderr)
        return 1
    server = _Server(ctl_in, ctl_out)
    gc.collect()
    gc.freeze()  # children never scan (and so never copy) what was made before forking
    return server.run()
