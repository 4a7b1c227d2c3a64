"""`rmctl`: a command-line client for the labelrm resource manager.

Output: a table by default (`-o wide` adds columns, `--no-headers` drops the header), a
``key = value`` view for `show` commands, `-o json` for the protobuf JSON mapping, `-o yaml`
for the same as YAML, `-o name` for ``kind/id`` lines. Lists take `--watch` (re-render every
`--watch-interval` seconds until Ctrl-C; when piped, only changed renderings are printed,
without screen control codes; with `-o json`, one JSON line per object that was added,
modified or deleted). Global options may also follow the subcommand. Ticket ids may be
abbreviated to a unique prefix.

Exit codes: 0 ok, 1 error (or an inconsistent `check`), 2 usage, 127 `rmctl dev` without
rm-server installed (otherwise rmctl becomes rm-server and exits as it does). An error is one
line on stderr: the status code, the reason and the message (a refusal's message names the
shortfall per label and dimension).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from labelrm.v1 import admin_pb2, resource_manager_pb2

from clients import load, load_instance
from clients._completion import SCRIPTS, candidates
from clients._errors import NotFound, RMError
from clients._filters import add_selector, matches, selected, state_arg
from clients._format import (
    STATE_NAMES,
    fmt_labels,
    fmt_resource,
    fmt_time,
    opt,
    print_details,
    print_json,
    print_list,
    print_table,
    run_watch,
    set_table_headers,
    to_json,
    visible,
)
from clients._impl import DEFAULT_TARGET, RMClient, parse_labels
from clients._output import (
    OUTPUTS,
    accept_globals_anywhere,
    chosen_parser,
    derived_output,
    stream_changes,
)
from clients.rmctl_demand import add_demand_commands
from clients.rmctl_describe import add_describe_commands
from clients.rmctl_dev import exec_rm_server_dev
from clients.rmctl_engineconn import add_engineconn_commands
from clients.rmctl_node import add_node_commands
from clients.rmctl_provider import add_provider_commands
from clients.rmctl_security import (
    add_connection_flags,
    add_local_commands,
    client_kwargs,
    run_local,
)
from clients.rmctl_status import add_status_commands
from labelrm_common.quantity import parse_cpu, parse_memory
from labelrm_common.version import VERSION

# --- arguments -------------------------------------------------------------------------------


def _labels_arg(text: str) -> list[Any]:
    try:
        out = parse_labels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not out:
        raise argparse.ArgumentTypeError("at least one key=value label is required")
    return out


def parse_size(text: str) -> int:
    """Bytes from "536870912", "512Mi", "2Gi" (binary) or "1G" (decimal), Kubernetes style."""
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_cores(text: str) -> int:
    """Millicores from "500m" or "2" / "0.5" (cores), Kubernetes style."""
    try:
        return parse_cpu(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_resource_args(c: argparse.ArgumentParser) -> None:
    """``--memory``, ``--cpu`` and ``--instances``: a resource, read by `resource_arg`."""
    c.add_argument(
        "--memory",
        type=parse_size,
        required=True,
        metavar="QUANTITY",
        help="512Mi, 2Gi (binary), 1G (decimal) or bytes",
    )
    c.add_argument("--cpu", type=parse_cores, required=True, metavar="QUANTITY",
                   help="cores (2, 0.5) or millicores (500m)")  # fmt: skip
    c.add_argument("--instances", type=_non_negative, default=None, metavar="N")


def resource_arg(args: argparse.Namespace) -> Any:
    """The resource `add_resource_args` read: a load, or a load with instances."""
    if args.instances is None:
        return load(args.memory, args.cpu)
    return load_instance(args.memory, args.cpu, args.instances)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from exc
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of rmctl."""
    p = argparse.ArgumentParser(
        prog="rmctl", description="labelrm resource manager client", allow_abbrev=False
    )
    p.add_argument(
        "--rm",
        default=os.environ.get("LABELRM_RM") or DEFAULT_TARGET,
        metavar="HOST:PORT",
        help="RM address (default: $LABELRM_RM or %(default)s)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table, wide (more columns), json, yaml, or name (kind/id per object)",
    )
    p.add_argument("--no-headers", action="store_true", help="tables without their header row")
    p.add_argument("--version", action="version", version=f"rmctl {VERSION}")
    p.add_argument("--timeout", type=float, default=10.0, help="per-call deadline in seconds")
    p.add_argument(
        "--watch-interval", type=float, default=2.0, metavar="SECONDS", help="for --watch"
    )
    # Bounds --watch (tests); a person stops it with Ctrl-C.
    p.add_argument("--watch-rounds", type=int, default=None, help=argparse.SUPPRESS)
    add_connection_flags(p)
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = cmds.add_parser(
        "completion",
        help="print the shell completion script: source <(rmctl completion bash|zsh)",
    )
    c.add_argument("shell", choices=sorted(SCRIPTS))
    c.set_defaults(func=None)  # handled in main(): needs no RM

    c = cmds.add_parser("check", help="check used/locked against live tickets (exit 1 if not)")
    c.set_defaults(func=cmd_check)

    c = cmds.add_parser(
        "dev",
        help="start an RM on the embedded database plus one local agent (foreground)",
        description="Runs the installed `rm-server --dev ARGS` (for example --data-dir,"
        " --listen); exit code 127 when rm-server is not installed.",
    )
    c.set_defaults(func=None)  # handled in main(): argparse cannot pass options through

    res = cmds.add_parser("resource", help="label resource records").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = res.add_parser("list", help="list resource records")
    c.add_argument("--source", choices=("ecm", "limit", "external"), default="")
    add_selector(c)
    _watchable(c)
    c.set_defaults(func=cmd_resource_list)
    c = res.add_parser("show", help="show one resource record")
    c.add_argument("labels", type=_labels_arg, metavar="LABELS", help='"k=v,k2=v2"')
    c.set_defaults(func=cmd_resource_show)

    tk = cmds.add_parser("ticket", help="tickets").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = tk.add_parser("list", help="list live tickets")
    c.add_argument("--label", default="", help="only tickets charged to this label")
    c.add_argument("--state", type=state_arg(("locked", "used")), default=None)
    add_selector(c)
    _watchable(c)
    c.set_defaults(func=cmd_ticket_list)
    c = tk.add_parser("show", help="show one ticket")
    c.add_argument("ticket_id", metavar="ID", help="a ticket id, or a unique prefix of a live one")
    c.set_defaults(func=cmd_ticket_show)

    lim = cmds.add_parser("limit", help="label limits").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = lim.add_parser("set", help="create or replace a limit")
    c.add_argument("pattern", type=_labels_arg, metavar="PATTERN", help='"k=v,k2=*"')
    add_resource_args(c)
    c.set_defaults(func=cmd_limit_set)
    c = lim.add_parser("list", help="list limits")
    _watchable(c)
    c.set_defaults(func=cmd_limit_list)
    c = lim.add_parser("rm", help="delete a limit")
    c.add_argument("pattern", type=_labels_arg, metavar="PATTERN")
    c.set_defaults(func=cmd_limit_rm)

    add_node_commands(cmds)
    add_engineconn_commands(cmds)
    add_demand_commands(cmds)
    add_status_commands(cmds)
    add_describe_commands(cmds)
    add_provider_commands(cmds)
    add_local_commands(cmds)
    accept_globals_anywhere(p, GLOBAL_DESTS)
    return p


# The top-level options every subcommand accepts too (`rmctl engineconn list -o json`).
GLOBAL_DESTS = (
    "rm", "output", "no_headers", "timeout", "watch_interval", "watch_rounds",
    "token", "tls_ca", "tls_cert", "tls_key",
)  # fmt: skip


def _watchable(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-w", "--watch", action="store_true", help="re-render until interrupted (Ctrl-C)"
    )


# --- commands --------------------------------------------------------------------------------

Command = Callable[[RMClient, argparse.Namespace, TextIO], int]


def cmd_check(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl check`."""
    report = client.check_consistency()
    if args.output == "json":
        print(to_json(report), file=out)
    elif report.consistent:
        print(
            f"consistent: {report.labels_checked} labels, {report.tickets_checked} tickets checked",
            file=out,
        )
    else:
        _mismatch_table(out, report.mismatches)
        print(f"inconsistent: {len(report.mismatches)} mismatches", file=sys.stderr)
    if report.over_limit and args.output != "json":
        # Expected after a limit was lowered below what is in use: a note, not a failure.
        _mismatch_table(out, report.over_limit, ("label", "field", "in use", "maximum", "detail"))
        print(
            f"note: {len(report.over_limit)} labels over their limit after a change"
            " (nothing more is granted there; they drain as tickets end)",
            file=sys.stderr,
        )
    return 0 if report.consistent else 1


def _mismatch_table(
    out: TextIO,
    rows: Any,
    header: tuple[str, ...] = ("label", "field", "stored", "expected", "detail"),
) -> None:
    print_table(
        out,
        header,
        (
            (
                m.label,
                m.field,
                fmt_resource(opt(m, "stored")),
                fmt_resource(opt(m, "expected")),
                m.detail or "-",
            )
            for m in rows
        ),
    )


def cmd_resource_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl resource list`."""
    records = [
        r
        for r in client.list_label_resources(source=args.source)
        if matches(parse_labels(r.label), args.selector)
    ]
    if args.output == "json":
        resp = resource_manager_pb2.ListLabelResourcesResponse(label_resources=records)
        print(to_json(resp), file=out)
        return 0
    wide = args.output == "wide"
    header: tuple[str, ...] = (
        "label", "source", "max", "used", "locked", "reserved", "left", "tickets"
    )  # fmt: skip
    if wide:
        header += ("protected", "updated")
    rows = []
    for r in records:
        # An external queue: YARN's maximum, and what YARN and labelrm's grants leave.
        queue = r.external_queue if r.HasField("external_queue") else None
        row: tuple[str, ...] = (
            r.label,
            r.source,
            fmt_resource(queue.yarn_max if queue else opt(r, "max_resource")),
            fmt_resource(opt(r, "used_resource")),
            fmt_resource(opt(r, "locked_resource")),
            fmt_resource(opt(r, "reserved_resource")),
            fmt_resource(queue.left if queue else opt(r, "left_resource")),
            str(r.live_tickets),
        )
        if wide:
            row += (fmt_resource(opt(r, "protected_resource")), fmt_time(r.update_time))
        rows.append(row)
    print_table(out, header, rows)
    return 0


def cmd_resource_show(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl resource show LABELS`."""
    try:
        r = client.get_label_resource(args.labels)
    except NotFound:
        # The record's name orders the labels as its rule does; the caller may not have.
        wanted = {(lb.key, lb.value) for lb in args.labels}
        found = [
            rec
            for rec in client.list_label_resources()
            if {(lb.key, lb.value) for lb in parse_labels(rec.label)} == wanted
        ]
        if len(found) != 1:
            raise
        r = found[0]
    if print_json(out, args.output, r):
        return 0
    rows = [
        ("label", r.label),
        ("source", r.source or "-"),
        ("max", fmt_resource(opt(r, "max_resource"))),
        ("protected", fmt_resource(opt(r, "protected_resource"))),
        ("used", fmt_resource(opt(r, "used_resource"))),
        ("locked", fmt_resource(opt(r, "locked_resource"))),
        ("reserved", fmt_resource(opt(r, "reserved_resource"))),
        ("left", fmt_resource(opt(r, "left_resource"))),
        ("tickets", str(r.live_tickets)),
        ("updated", fmt_time(r.update_time)),
    ]
    if r.HasField("external_queue"):
        q = r.external_queue
        failed = f" (latest fetch: {q.error})" if q.error else ""
        rows += [
            ("yarn queue", f"{q.queue} ({q.scheduler} scheduler)"),
            ("yarn max", fmt_resource(q.yarn_max)),
            ("yarn used", fmt_resource(q.yarn_used)),
            ("labelrm in flight", fmt_resource(q.in_flight)),
            ("yarn left", fmt_resource(q.left)),
            ("yarn apps", f"{q.apps_running} running, {q.apps_pending} pending"),
            ("yarn fetched", fmt_time(q.fetch_time) + failed),
        ]
    print_details(out, rows)
    return 0


def _ticket_row(t: Any, wide: bool = False) -> tuple[str, ...]:
    row: tuple[str, ...] = (
        t.ticket_id,
        STATE_NAMES.get(t.state, str(t.state)),
        t.user or "-",
        ";".join(t.charged_labels) or "-",
        fmt_resource(opt(t, "requested_resource")),
        fmt_resource(opt(t, "used_resource")),
        fmt_time(t.create_time),
    )
    if wide:
        row += (fmt_labels(t.labels), fmt_time(t.lock_expire_time), fmt_time(t.update_time))
    return row


_TICKET_HEADER = ("ticket_id", "state", "user", "charged", "requested", "used", "created")
_TICKET_WIDE = (*_TICKET_HEADER, "labels", "lock_expires", "updated")


def resolve_ticket(client: RMClient, given: str) -> Any:
    """The ticket with id `given`, or the one live ticket whose id starts with it."""
    try:
        return client.get_ticket(given)
    except NotFound:
        matches = [t for t in client.list_tickets() if t.ticket_id.startswith(given)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise
        shown = ", ".join(t.ticket_id for t in matches[:3])
        more = f" and {len(matches) - 3} more" if len(matches) > 3 else ""
        raise ValueError(
            f"ticket id prefix {given!r} is ambiguous: {len(matches)} live tickets match "
            f"({shown}{more})"
        ) from None


def cmd_ticket_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket list`."""
    tickets = selected(client.list_tickets(label=args.label, state=args.state), args.selector)
    resp = resource_manager_pb2.ListTicketsResponse(tickets=tickets)
    return print_list(out, args.output, resp, tickets, _ticket_row, (_TICKET_HEADER, _TICKET_WIDE))


def cmd_ticket_show(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket show ID`."""
    t = resolve_ticket(client, args.ticket_id)
    if print_json(out, args.output, t):
        return 0
    rows = [
        ("ticket_id", t.ticket_id),
        ("state", STATE_NAMES.get(t.state, str(t.state))),
        ("user", t.user or "-"),
        ("labels", fmt_labels(t.labels)),
        ("charged", ";".join(t.charged_labels) or "-"),
        ("requested", fmt_resource(opt(t, "requested_resource"))),
        ("used", fmt_resource(opt(t, "used_resource"))),
        ("created", fmt_time(t.create_time)),
        ("updated", fmt_time(t.update_time)),
        ("lock_expires", fmt_time(t.lock_expire_time)),
        ("ended", fmt_time(t.end_time)),
        ("end_reason", t.end_reason or "-"),
    ]
    print_details(out, rows)
    return 0


def cmd_limit_set(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl limit set PATTERN --memory QUANTITY --cpu QUANTITY [--instances N]`."""
    limit = client.set_label_limit(args.pattern, resource_arg(args))
    if print_json(out, args.output, limit):
        return 0
    print_table(
        out,
        ("pattern", "max", "updated"),
        [(limit.pattern, fmt_resource(opt(limit, "max_resource")), fmt_time(limit.update_time))],
    )
    return 0


def cmd_limit_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl limit list`."""
    limits = list(client.list_label_limits())
    if print_json(out, args.output, admin_pb2.ListLabelLimitsResponse(limits=limits)):
        return 0
    print_table(
        out,
        ("pattern", "max", "updated"),
        (
            (lim.pattern, fmt_resource(opt(lim, "max_resource")), fmt_time(lim.update_time))
            for lim in limits
        ),
    )
    return 0


def cmd_limit_rm(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl limit rm PATTERN`."""
    affected = client.delete_label_limit(args.pattern)
    if args.output == "json":
        print(to_json(admin_pb2.DeleteLabelLimitResponse(affected_labels=affected)), file=out)
    else:
        pattern = ",".join(f"{lb.key}={lb.value}" for lb in args.pattern)
        print(f"deleted limit {pattern} ({affected} label records changed)", file=out)
    return 0


# --- entry point -----------------------------------------------------------------------------


def error_line(err: RMError) -> str:
    """``error: CODE (REASON): message``, on one line; a refusal names every shortfall.

    The reason is left out when it only repeats the code; the shortfalls are appended
    unless the server's message already lists them.
    """
    head = err.code.name
    if err.reason and err.reason != head:
        head += f" ({err.reason})"
    message = visible(" ".join(err.message.split()))  # one line, whatever the server sent
    missing = [str(s) for s in getattr(err, "shortfalls", ()) if str(s) not in message]
    if missing:
        message += ": " + "; ".join(missing)
    return f"error: {head}: {message}"


def report_error(err: RMError, stream: TextIO) -> None:
    """Print `error_line(err)` to `stream`."""
    print(error_line(err), file=stream)


_GLOBAL_WITH_VALUE = frozenset(
    {
        "--rm",
        "-o",
        "--output",
        "--timeout",
        "--watch-interval",
        "--watch-rounds",
        "--token",
        "--tls-ca",
        "--tls-cert",
        "--tls-key",
    }
)


def _command_index(words: list[str]) -> int | None:
    """Where the command word is, skipping global options and their values."""
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word in _GLOBAL_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            return i
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run rmctl; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    at = _command_index(words)
    if at is not None and words[at] == "dev" and not {"-h", "--help"} & set(words):
        return exec_rm_server_dev(words[at + 1 :])  # rm-server's own process from here on
    parser = build_parser()
    if words[:1] == ["__complete"] and len(words) > 2 and words[1].isdigit():
        print("\n".join(candidates(parser, words[2:], int(words[1]))))
        return 0
    if words[:1] == ["completion"] and len(words) == 2 and words[1] in SCRIPTS:
        sys.stdout.write(SCRIPTS[words[1]])
        return 0
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # the subcommand's usage, not rmctl's
            chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    local = run_local(args)  # `pki`, `token`: local files, no RM
    if local is not None:
        return local
    func: Command = args.func
    mode = args.output
    if mode in ("yaml", "name"):  # views of the JSON output
        args.output = "json"
    set_table_headers(not args.no_headers)
    try:
        with RMClient(args.rm, timeout=args.timeout, **client_kwargs(args)) as client:

            def render(out: TextIO) -> int:
                if mode not in ("yaml", "name"):
                    return func(client, args, out)
                buf = io.StringIO()
                code = func(client, args, buf)
                derived_output(mode, buf.getvalue(), out)
                return code

            if getattr(args, "watch", False):
                if mode == "json":
                    return stream_changes(
                        render, sys.stdout, interval=args.watch_interval, rounds=args.watch_rounds
                    )
                title = "rmctl " + " ".join(argv if argv is not None else sys.argv[1:])
                return run_watch(
                    render,
                    sys.stdout,
                    interval=args.watch_interval,
                    title=title,
                    rounds=args.watch_rounds,
                )
            return render(sys.stdout)
    except RMError as err:
        report_error(err, sys.stderr)
        return 1
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
