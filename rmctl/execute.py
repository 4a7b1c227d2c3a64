"""`rmctl engineconn exec|cancel`: running code in an EngineConn, and stopping it.

Ctrl-C during `exec` asks the engine to stop the code (ExecutorService.Cancel) and waits
for the execution's end, up to CANCEL_WAIT seconds: the EngineConn is free again when
rmctl returns. A second Ctrl-C, or code that does not stop in time (code that catches
the interrupt and goes on, or a C extension that ignores it), leaves with a line that
says so and what to do.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TextIO

from labelrm.v1 import engine_conn_pb2

from labelrm_client import RMClient, RMError
from labelrm_client._engineconn import ExecResult, ec_state_name
from rmctl.resolve import resolve_engine_conn

__all__ = ["add_exec_commands"]

DEFAULT_EXEC_TIMEOUT = 3600.0  # rmctl exec: the code is stopped, and the call ends, by then
CANCEL_WAIT = 10.0  # seconds Ctrl-C and `cancel` wait for the code to stop
_STATE_POLL = 0.2  # seconds between GetEngineConn calls while `cancel` waits
_READY = (engine_conn_pb2.ENGINE_CONN_STATE_IDLE, engine_conn_pb2.ENGINE_CONN_STATE_BUSY)
_BUSY = engine_conn_pb2.ENGINE_CONN_STATE_BUSY
_CANCELLED = 130  # as a shell reports an interrupted program


def add_exec_commands(sub: Any) -> None:
    """Register ``rmctl engineconn exec`` and ``cancel`` on the engineconn sub-commands."""
    c = sub.add_parser(
        "exec", help="run code in an EngineConn; exits with the execution's exit code"
    )
    c.add_argument("ec_id", metavar="ID", help="an EngineConn id, or a unique prefix")
    c.add_argument("code", metavar="CODE", help="bash (shell) or Python (python); - = stdin")
    c.add_argument(
        "--exec-timeout",
        type=float,
        default=DEFAULT_EXEC_TIMEOUT,
        metavar="SECONDS",
        help="stop the code after this long (default %(default)s; 0 = no limit)",
    )
    c.set_defaults(func=cmd_ec_exec)

    c = sub.add_parser(
        "cancel",
        help="stop the code running in an EngineConn and wait until it is IDLE",
        description="Cancel what runs in the EngineConn (its `exec` ends with exit code "
        "130) and wait until it is IDLE again. Exit 1 when it is still BUSY after --wait.",
    )
    c.add_argument("ec_id", metavar="ID", help="an EngineConn id, or a unique prefix")
    c.add_argument(
        "--wait", type=float, default=CANCEL_WAIT, metavar="SECONDS",
        help="how long to wait for the code to stop (default %(default)s)",
    )  # fmt: skip
    c.set_defaults(func=cmd_ec_cancel)


def _executor_of(client: RMClient, given: str) -> Any:
    """The EngineConn `given` names, as Get returns it (with its secret); ValueError when it
    has no executor (not ready, or ended)."""
    ec = resolve_engine_conn(client, given)
    if ec.state not in _READY or not ec.address:
        raise ValueError(
            f"EngineConn {ec.engine_conn_id} is {ec_state_name(ec.state)}: it has no executor"
        )
    return ec


def _exit_status(result: ExecResult) -> int:
    """A process exit status for the execution's exit code (signal -N -> 128 + N)."""
    code = result.exit_code
    if code < 0:
        return min(128 - code, 255)
    if code == 0 and result.cancelled:
        return _CANCELLED
    return code if code <= 255 else 1


class _Interrupts:
    """Ctrl-C while an execution runs. The first sends Cancel (in a thread: the main one
    goes on reading the stream, which ends with the result) and arms a timer; a second
    Ctrl-C, or the timer, raises KeyboardInterrupt in the main thread."""

    def __init__(self, cancel: Callable[[], bool], grace: float, label: str) -> None:
        self._cancel = cancel
        self._grace = grace
        self._label = label
        self.requested = False  # the first Ctrl-C came
        self.stopped = threading.Event()  # the stream ended: nothing to interrupt
        self.problem = ""  # why the Cancel call failed, if it did

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested or self.stopped.is_set():
            raise KeyboardInterrupt
        self.requested = True
        print(
            f"\ncancelling {self._label}: waiting up to {self._grace:g}s for the code to stop "
            "(Ctrl-C again to leave it running)",
            file=sys.stderr,
            flush=True,
        )
        threading.Thread(target=self._run, name="rmctl-cancel", daemon=True).start()

    def _run(self) -> None:
        try:
            self._cancel()
        except RMError as err:
            self.problem = f"the cancel failed: {err.code.name}: {err.message}"
        if not self.stopped.wait(self._grace):
            _thread.interrupt_main()  # runs `handle` again, which raises there

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Our SIGINT handler for the duration (only the main thread may set one)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self.handle)
        try:
            yield
        finally:
            self.stopped.set()
            signal.signal(signal.SIGINT, previous)


def cmd_ec_exec(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn exec ID CODE`: stdout and stderr stream as they come."""
    code = sys.stdin.read() if args.code == "-" else args.code
    ec = _executor_of(client, args.ec_id)
    execution_id = str(uuid.uuid4())
    interrupts = _Interrupts(
        lambda: client.cancel_execution(ec, execution_id),
        CANCEL_WAIT,
        f"execution {execution_id} in {ec.engine_conn_id}",
    )
    # Closed here, not whenever the garbage collector gets to it: a generator left open
    # when the loop returns is finalized later, possibly inside grpc's own channel code,
    # and its channel close then waits on itself (rmctl printed the output and hung).
    items = client.execute(ec, code, timeout=args.exec_timeout or None, execution_id=execution_id)
    with contextlib.closing(items), interrupts.installed():
        try:
            for item in items:
                if isinstance(item, ExecResult):
                    interrupts.stopped.set()
                    return _ended(item, interrupts.requested, execution_id)
                stream = out if item.stream == "stdout" else sys.stderr
                stream.write(item.text)
                stream.flush()
        except KeyboardInterrupt:
            interrupts.stopped.set()
            items.close()  # the stream goes; the engine stops the code when it can
            print(_left_running(ec.engine_conn_id, interrupts), file=sys.stderr)
            return _CANCELLED
    raise ValueError("the execution ended without a result")  # the stream broke off


def _ended(result: ExecResult, interrupted: bool, execution_id: str) -> int:
    """Print how the execution ended (its error, or that it was cancelled); its status."""
    if result.error:
        print(result.error.rstrip("\n"), file=sys.stderr)
    if result.cancelled and "timed out" not in result.error:
        who = "" if interrupted else " (by `rmctl engineconn cancel` or another client)"
        print(f"execution {execution_id} cancelled{who}", file=sys.stderr)
        return _CANCELLED
    return _exit_status(result)


def _left_running(ec_id: str, interrupts: _Interrupts) -> str:
    why = interrupts.problem or (
        "the code did not stop in time (it may catch the interrupt and go on, or run in a C "
        "extension that ignores it)"
    )
    return (
        f"interrupted: {why}; EngineConn {ec_id} stays BUSY until the code ends. "
        f"`rmctl engineconn cancel {ec_id}` asks again, `rmctl engineconn kill {ec_id}` "
        "ends the EngineConn"
    )


def cmd_ec_cancel(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn cancel ID [--wait SECONDS]`."""
    ec = _executor_of(client, args.ec_id)
    ec_id = ec.engine_conn_id
    if not client.cancel_execution(ec):
        print(f"{ec_id} {ec_state_name(ec.state)}: nothing was running", file=out)
        return 0
    deadline = time.monotonic() + args.wait
    state = _BUSY
    while True:
        state = client.get_engine_conn(ec_id).state
        if state != _BUSY or time.monotonic() >= deadline:
            break
        time.sleep(_STATE_POLL)
    if state == _BUSY:
        raise ValueError(
            f"EngineConn {ec_id} is still BUSY {args.wait:g}s after the cancel: the code has "
            "not stopped (it may catch the interrupt and go on); "
            f"`rmctl engineconn kill {ec_id}` ends the EngineConn"
        )
    print(f"{ec_id} {ec_state_name(state)}: execution cancelled", file=out)
    return 0
