"""`rmctl engineconn create|list|status|kill`, with `exec|cancel` (rmctl/execute.py) and
`logs` (rmctl/logs.py): EngineConns.

The commands have rmctl's signature ``(client, args, out) -> exit code``; `exec` returns
the execution's own exit code.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

from labelrm.v1 import engine_conn_pb2

from labelrm_client import RMClient
from labelrm_client._engineconn import EC_STATES, LIVE_EC_STATES, ec_state_name
from rmctl.args import (
    add_selector,
    add_sort_by,
    labels_arg,
    matches,
    parse_cores,
    parse_size,
    sort_rows,
    state_arg,
)
from rmctl.execute import add_exec_commands
from rmctl.format import (
    fmt_age,
    fmt_labels,
    fmt_resource,
    fmt_time,
    fmt_usage,
    opt,
    print_details,
    print_list,
    to_json,
    visible,
)
from rmctl.logs import add_logs_command
from rmctl.resolve import resolve_ecm, resolve_engine_conn

__all__ = ["register", "show_engine_conn", "with_progress"]

T = TypeVar("T")

_SPINNER = "|/-\\"


def register(cmds: Any) -> None:
    """Register ``rmctl engineconn ...`` on rmctl's sub-command parsers."""
    ec = cmds.add_parser(
        "engineconn",
        aliases=["engineconns", "ec"],
        help="EngineConns: create, list, status, kill, exec, cancel, logs",
    )
    sub = ec.add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")

    c = sub.add_parser("create", help="start an EngineConn and wait until it is ready")
    c.add_argument(
        "--labels",
        type=labels_arg,
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
        help="engine parameter, e.g. max_idle_seconds=600 or memory_bytes=512Mi (repeatable)",
    )
    c.add_argument(
        "--memory",
        type=parse_size,
        metavar="QUANTITY",
        help="memory it asks for, e.g. 512Mi or 2Gi (default: the engine's)",
    )
    c.add_argument(
        "--cpu",
        type=parse_cores,
        metavar="QUANTITY",
        help="CPU it asks for, e.g. 500m or 2 (default: the engine's)",
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
        c = sub.add_parser(name, aliases=["delete"] if name == "kill" else [], help=text)
        c.add_argument("ec_id", metavar="ID", help="an EngineConn id, or a unique prefix")
        if name == "kill":
            c.add_argument("--reason", default="", help="recorded as the EngineConn's reason")
        c.set_defaults(func=func)

    add_exec_commands(sub)
    add_logs_command(sub)


def _param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"parameter {text!r} is not of the form key=value")
    return key.strip(), value


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
        # Asked for, what its ticket charges (its cgroup's limits), what it uses.
        ("requested", fmt_resource(opt(ec, "resource"))),
        ("granted", fmt_resource(opt(ec, "granted_resource"))),
        ("measured", fmt_usage(opt(ec, "measured"))),
        ("measured_at", fmt_time(ec.measure_time)),
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
    """`rmctl engineconn create --labels L [--user U] [--memory Q] [--cpu Q] [--param K=V]...
    [--reuse] [-q]`."""
    params = dict(args.params)
    engine = next((lb.value for lb in args.labels if lb.key == "engineType"), "EngineConn")
    label = f"starting {engine}" + (f" for {args.user}" if args.user else "")

    size = {"memory": args.memory, "cpu": args.cpu}

    def call() -> Any:
        if args.reuse:
            ec, _ = client.ask_engine_conn(
                args.labels, args.user, params, timeout=args.start_timeout, **size
            )
            return ec
        return client.create_engine_conn(args.labels, args.user, params, args.start_timeout, **size)

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


def show_engine_conn(ec: Any, output: str, out: TextIO) -> None:
    """The detail view of an EngineConn and its ECM choices (JSON with ``-o json``)."""
    if output == "json":
        print(to_json(ec), file=out)
    else:
        _print_engine_conn(ec, out)


def cmd_ec_status(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn status ID`."""
    show_engine_conn(resolve_engine_conn(client, args.ec_id), args.output, out)
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
