"""`rmctl engineconn create|list|status|kill|exec|logs`: EngineConns.

Wired into rmctl by one call in ``build_parser``: ``add_engineconn_commands(cmds)``. The
commands have rmctl's signature ``(client, args, out) -> exit code``; `exec` returns the
execution's own exit code.

Logs: the RM keeps only the tail of a failed EngineConn's log. The full logs are files on
the agent's host, ``<work_dir>/logs/{stdout,stderr}.log``; `logs` reads them when that
directory is readable from here (dev mode, or rmctl run on the agent host as root or as
the EngineConn's user) and otherwise prints the stored tail and says where they are.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from labelrm.v1 import engine_conn_pb2

from clients._engineconn import EC_STATES, LIVE_EC_STATES, ExecResult, ec_state_name
from clients._errors import Unavailable
from clients._filters import add_selector, add_sort_by, fmt_age, matches, sort_rows, state_arg
from clients._format import (
    fmt_labels,
    fmt_resource,
    fmt_time,
    opt,
    print_details,
    print_list,
    terminal_text,
    to_json,
    visible,
)
from clients._impl import RMClient
from clients.rmctl_node import resolve_by_prefix, resolve_ecm

__all__ = ["add_engineconn_commands", "resolve_engine_conn", "with_progress"]

T = TypeVar("T")

LOG_FILES = ("stdout.log", "stderr.log")
DEFAULT_EXEC_TIMEOUT = 3600.0  # rmctl exec: the code is stopped, and the call ends, by then
_FOLLOW_POLL = 0.25  # seconds between reads of the log files while following
_STATE_POLL = 1.0  # seconds between GetEngineConn calls while following
_READY = (engine_conn_pb2.ENGINE_CONN_STATE_IDLE, engine_conn_pb2.ENGINE_CONN_STATE_BUSY)
_SPINNER = "|/-\\"


def add_engineconn_commands(cmds: Any) -> None:
    """Register ``rmctl engineconn ...`` on rmctl's sub-command parsers."""
    # rmctl imports this module; importing its argument type here, at call time, avoids
    # an import cycle.
    from clients.rmctl import _labels_arg

    ec = cmds.add_parser("engineconn", help="EngineConns: create, list, status, kill, exec, logs")
    sub = ec.add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")

    c = sub.add_parser("create", help="start an EngineConn and wait until it is ready")
    c.add_argument(
        "--labels",
        type=_labels_arg,
        required=True,
        metavar="LABELS",
        help='"userCreator=alice-IDE,engineType=shell-1[,k=v...]"',
    )
    c.add_argument("--user", default="", help="who it runs as (default: userCreator's user)")
    c.add_argument(
        "--param",
        dest="params",
        action="append",
        type=_param,
        default=[],
        metavar="K=V",
        help="engine parameter, e.g. max_idle_seconds=600 (repeatable)",
    )
    c.add_argument(
        "--start-timeout", type=float, default=60.0, metavar="SECONDS", help="wait for ready"
    )
    c.add_argument("--reuse", action="store_true", help="reuse an idle one (AskEngineConn)")
    c.add_argument("-q", "--quiet", action="store_true", help="print only the EngineConn id")
    c.set_defaults(func=cmd_ec_create)

    c = sub.add_parser("list", help="list live EngineConns (-A: ended ones too)")
    c.add_argument("--user", default="")
    c.add_argument(
        "--state",
        action="append",
        type=state_arg(EC_STATES),
        default=[],
        metavar="STATE",
        help=f"only in this state, any case, repeatable: {', '.join(sorted(EC_STATES))}",
    )
    c.add_argument("-A", "--all", action="store_true", help="ended EngineConns too")
    c.add_argument("--ecm", default="", metavar="INSTANCE", help="an ECM, or a unique prefix")
    add_selector(c)
    add_sort_by(c, list(_SORT_KEYS))
    c.add_argument(
        "-w", "--watch", action="store_true", help="re-render until interrupted (Ctrl-C)"
    )
    c.set_defaults(func=cmd_ec_list)

    for name, func, text in (
        ("status", cmd_ec_status, "show one EngineConn and the ECM choices made for it"),
        ("kill", cmd_ec_kill, "stop an EngineConn (TERM, then KILL after a grace period)"),
    ):
        c = sub.add_parser(name, help=text)
        c.add_argument("ec_id", metavar="ID", help="an EngineConn id, or a unique prefix")
        if name == "kill":
            c.add_argument("--reason", default="", help="recorded as the EngineConn's reason")
        c.set_defaults(func=func)

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

    c = sub.add_parser("logs", help="print an EngineConn's stdout and stderr logs")
    c.add_argument("ec_id", metavar="ID", help="an EngineConn id, or a unique prefix")
    c.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until it ends (or Ctrl-C)"
    )
    c.set_defaults(func=cmd_ec_logs)


def _param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"parameter {text!r} is not of the form key=value")
    return key.strip(), value


def resolve_engine_conn(client: RMClient, given: str) -> Any:
    """The EngineConn with id `given`, or the one whose id starts with it."""
    return resolve_by_prefix(
        "EngineConn id",
        given,
        client.get_engine_conn,
        client.list_engine_conns,
        lambda e: str(e.engine_conn_id),
    )


# --- progress ----------------------------------------------------------------------------


def with_progress(label: str, call: Callable[[], T], stream: TextIO) -> T:
    """Run `call`; on a terminal, show a spinner with the elapsed time on `stream` meanwhile.

    Piped (not a terminal) it just calls: no control codes in logs or captured output.
    """
    if not stream.isatty():
        return call()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    # A daemon thread: on Ctrl-C rmctl exits and closes the channel, which cancels the
    # call; nothing has to join this thread first.
    worker = threading.Thread(target=run, name="rmctl-progress", daemon=True)
    started = time.monotonic()
    worker.start()
    try:
        tick = 0
        while worker.is_alive():
            stream.write(f"\r{_SPINNER[tick % 4]} {label} {time.monotonic() - started:.0f}s")
            stream.flush()
            tick += 1
            worker.join(0.2)
    finally:
        stream.write("\r\x1b[K")
        stream.flush()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# --- views -------------------------------------------------------------------------------


def _engine(ec: Any) -> str:
    return next((lb.value for lb in ec.labels if lb.key == "engineType"), "-")


_HEADER = ("engine_conn_id", "state", "user", "engine", "ecm", "address", "age")
_WIDE = (*_HEADER, "created", "resource", "pid", "ticket", "labels", "reason")
_SORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "engine_conn_id": lambda ec: ec.engine_conn_id,
    "state": lambda ec: ec_state_name(ec.state),
    "user": lambda ec: ec.user,
    "engine": _engine,
    "ecm": lambda ec: ec.ecm_instance,
    # Youngest first, as kubectl sorts by age.
    "age": lambda ec: (-ec.create_time.seconds, -ec.create_time.nanos),
}


def _row(ec: Any, wide: bool) -> tuple[str, ...]:
    row: tuple[str, ...] = (
        ec.engine_conn_id,
        ec_state_name(ec.state),
        ec.user or "-",
        _engine(ec),
        ec.ecm_instance or "-",
        ec.address or "-",
        fmt_age(ec.create_time),
    )
    if wide:
        row += (
            fmt_time(ec.create_time),
            fmt_resource(opt(ec, "resource")),
            str(ec.pid or "-"),
            ec.ticket_id or "-",
            fmt_labels(ec.labels),
            " ".join(ec.reason.split()) or "-",
        )
    return row


def _print_engine_conn(ec: Any, out: TextIO) -> None:
    ended = ec.state not in LIVE_EC_STATES
    rows = [
        ("engine_conn_id", ec.engine_conn_id),
        ("state", ec_state_name(ec.state)),
        ("user", ec.user or "-"),
        ("labels", fmt_labels(ec.labels)),
        ("params", ",".join(f"{k}={v}" for k, v in sorted(ec.params.items())) or "-"),
        ("resource", fmt_resource(opt(ec, "resource"))),
        ("ecm", ec.ecm_instance or "-"),
        ("address", ec.address or "-"),
        ("pid", str(ec.pid or "-")),
        ("ticket", ec.ticket_id or "-"),
        ("launch_attempts", str(ec.launch_attempts)),
        ("exit_code", str(ec.exit_code) if ended and ec.end_time.seconds else "-"),
        ("reason", " ".join(ec.reason.split()) or "-"),
        ("work_dir", ec.work_dir or "-"),
        ("holder", ec.holder or "-"),
        ("hold_expires", fmt_time(ec.hold_expire_time)),
        ("created", fmt_time(ec.create_time)),
        ("ready", fmt_time(ec.ready_time)),
        ("updated", fmt_time(ec.update_time)),
        ("ended", fmt_time(ec.end_time)),
    ]
    # The ranked ECM choices, best first, each with every selection rule's reason.
    for rank, choice in enumerate(ec.ecm_choices, 1):
        verdict = "eligible" if choice.eligible else "not eligible"
        reasons = "; ".join(choice.reasons) or "-"
        rows.append(
            (
                f"ecm_choice.{rank}",
                f"{choice.instance} {verdict} score={choice.score:.3f}: {reasons}",
            )
        )
    print_details(out, rows)
    if ec.log_tail.strip():
        print("\nlog tail (kept by the RM):", file=out)
        for line in ec.log_tail.rstrip("\n").split("\n"):
            print(f"  {visible(line, keep=chr(9))}", file=out)  # tabs pass


# --- commands ----------------------------------------------------------------------------


def cmd_ec_create(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn create --labels L [--user U] [--param K=V]... [--reuse] [-q]`."""
    params = dict(args.params)
    engine = next((lb.value for lb in args.labels if lb.key == "engineType"), "EngineConn")
    label = f"starting {engine}" + (f" for {args.user}" if args.user else "")

    def call() -> Any:
        if args.reuse:
            ec, _ = client.ask_engine_conn(
                args.labels, args.user, params, timeout=args.start_timeout
            )
            return ec
        return client.create_engine_conn(args.labels, args.user, params, args.start_timeout)

    try:
        ec = with_progress(label, call, sys.stderr)
    except KeyboardInterrupt:
        # Leaving closes the channel: the server sees the call cancelled and gives up on it.
        print("interrupted: the EngineConn was not started", file=sys.stderr)
        return 130
    if args.quiet:
        print(ec.engine_conn_id, file=out)
    elif args.output == "json":
        print(to_json(ec), file=out)
    else:
        _print_engine_conn(ec, out)
    return 0


def list_filtered(client: RMClient, args: argparse.Namespace) -> list[Any]:
    """The EngineConns `engineconn list` shows: live ones (every one with -A), in the given
    states, of the user, on the ECM (a unique prefix is enough), with the labels."""
    ecm = resolve_ecm(client, args.ecm).instance if args.ecm else ""
    if args.state:
        states: list[str | None] = sorted(set(args.state))
    elif args.all:
        states = [None]
    else:  # one filtered query per live state: the server filters cheaper than we do
        states = [ec_state_name(st).lower() for st in sorted(LIVE_EC_STATES)]
    ecs = [
        ec
        for state in states
        for ec in client.list_engine_conns(user=args.user, state=state, ecm=ecm)
        if matches(ec.labels, args.selector)
    ]
    ecs.sort(key=lambda ec: str(ec.engine_conn_id))
    return sort_rows(ecs, args.sort_by, _SORT_KEYS)


def cmd_ec_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn list [-A] [--user U] [--state S]... [--ecm NAME] [-l K=V]
    [--sort-by COLUMN]`."""
    ecs = list_filtered(client, args)
    resp = engine_conn_pb2.ListEngineConnsResponse(engine_conns=ecs)
    return print_list(out, args.output, resp, ecs, _row, (_HEADER, _WIDE))


def cmd_ec_status(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn status ID`."""
    ec = resolve_engine_conn(client, args.ec_id)
    if args.output == "json":
        print(to_json(ec), file=out)
    else:
        _print_engine_conn(ec, out)
    return 0


def cmd_ec_kill(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn kill ID [--reason TEXT]`."""
    given = resolve_engine_conn(client, args.ec_id)
    ec = client.kill_engine_conn(given.engine_conn_id, args.reason)
    if args.output == "json":
        print(to_json(ec), file=out)
    elif given.state not in LIVE_EC_STATES:
        print(f"{ec.engine_conn_id} had already ended: {ec_state_name(ec.state)}", file=out)
    else:
        reason = visible(ec.reason) or "killed"
        print(f"{ec.engine_conn_id} {ec_state_name(ec.state)}: {reason}", file=out)
    return 0


def _exit_status(result: ExecResult) -> int:
    """A process exit status for the execution's exit code (signal -N -> 128 + N)."""
    code = result.exit_code
    if code < 0:
        return min(128 - code, 255)
    if code == 0 and result.cancelled:
        return 130
    return code if code <= 255 else 1


def cmd_ec_exec(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn exec ID CODE`: stdout and stderr stream as they come."""
    code = sys.stdin.read() if args.code == "-" else args.code
    ec = resolve_engine_conn(client, args.ec_id)
    if ec.state not in _READY or not ec.address:
        raise ValueError(
            f"EngineConn {ec.engine_conn_id} is {ec_state_name(ec.state)}: it has no executor"
        )
    if not ec.secret:  # found by prefix in a list, which never carries executor secrets
        ec = client.get_engine_conn(ec.engine_conn_id)
    # Closed here, not whenever the garbage collector gets to it: a generator left open
    # when the loop returns is finalized later, possibly inside grpc's own channel code,
    # and its channel close then waits on itself (rmctl printed the output and hung).
    with contextlib.closing(client.execute(ec, code, timeout=args.exec_timeout or None)) as items:
        try:
            for item in items:
                if isinstance(item, ExecResult):
                    if item.error:
                        print(item.error.rstrip("\n"), file=sys.stderr)
                    return _exit_status(item)
                stream = out if item.stream == "stdout" else sys.stderr
                stream.write(item.text)
                stream.flush()
        except KeyboardInterrupt:
            items.close()  # cancels the stream: the engine stops the code
            print("\ninterrupted: execution cancelled", file=sys.stderr)
            return 130
    raise ValueError("the execution ended without a result")  # the stream broke off


# --- logs --------------------------------------------------------------------------------


def _open_log(path: Path) -> int | None:
    """An fd on `path` if it is a regular file we may read (never through a symlink, never
    blocking on a FIFO a user left there), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def readable_log_dir(ec: Any) -> Path | None:
    """``<work_dir>/logs`` when it exists on this host and we may read it, else None."""
    if not ec.work_dir:
        return None
    logs = Path(ec.work_dir) / "logs"
    if not logs.is_dir() or not os.access(logs, os.R_OK | os.X_OK):
        return None
    for name in LOG_FILES:  # a file that is not there yet (not started) is fine
        if (logs / name).exists() and not os.access(logs / name, os.R_OK):
            return None
    return logs


class _LogReader:
    """Reads what was appended to each log file since the last call."""

    def __init__(self, logs: Path, out: TextIO) -> None:
        self.logs = logs
        self.out = out
        self.offsets = dict.fromkeys(LOG_FILES, 0)
        self.decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in LOG_FILES}
        self.last: str | None = None

    def pump(self) -> None:
        for name in LOG_FILES:
            fd = _open_log(self.logs / name)
            if fd is None:
                continue
            with contextlib.closing(os.fdopen(fd, "rb")) as fh:
                size = os.fstat(fd).st_size
                if size < self.offsets[name]:  # truncated or replaced: start over
                    self.offsets[name] = 0
                fh.seek(self.offsets[name])
                data = fh.read()
            if not data:
                continue
            self.offsets[name] += len(data)
            # Control characters a log could use to rewrite an operator's terminal (ESC,
            # C1, ...) are written out on a terminal; tab, newline and carriage return pass.
            text = terminal_text(self.decoders[name].decode(data), self.out)
            if name != self.last:
                print(f"==> {self.logs / name} <==", file=self.out)
                self.last = name
            self.out.write(text if text.endswith("\n") else text + "\n")
            self.out.flush()


def _print_stored_tail(ec: Any, out: TextIO) -> int:
    where = (
        f"on ECM {ec.ecm_instance or '?'} in {ec.work_dir}/logs (stdout.log, stderr.log, "
        "launcher.log)"
        if ec.work_dir
        else f"nowhere: EngineConn {ec.engine_conn_id} never got a work directory"
    )
    if not ec.log_tail.strip():
        raise ValueError(
            f"no logs of {ec.engine_conn_id} here: the RM keeps a tail only when an "
            f"EngineConn fails, and its log files are {where}, not readable from this host"
        )
    tail = terminal_text(ec.log_tail, out)
    out.write(tail if tail.endswith("\n") else tail + "\n")
    print(f"note: this is the tail the RM kept; the full logs are {where}", file=sys.stderr)
    return 0


def cmd_ec_logs(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn logs ID [-f]`."""
    ec = resolve_engine_conn(client, args.ec_id)
    logs = readable_log_dir(ec)
    if logs is None:
        return _print_stored_tail(ec, out)
    reader = _LogReader(logs, out)
    reader.pump()
    if not args.follow:
        return 0
    # No deadline: follow until the EngineConn ends or the operator presses Ctrl-C.
    next_check = time.monotonic() + _STATE_POLL
    try:
        while ec.state in LIVE_EC_STATES:
            time.sleep(_FOLLOW_POLL)
            reader.pump()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + _STATE_POLL
                with contextlib.suppress(Unavailable):  # an RM restart does not stop a follow
                    ec = client.get_engine_conn(ec.engine_conn_id)
        reader.pump()  # what it wrote while ending
    except KeyboardInterrupt:
        return 0
    return 0
