"""`rmctl`: a command-line client for the labelrm resource manager.

Exit codes: 0 ok, 1 error (or an inconsistent `check`), 2 usage.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from google.protobuf import json_format
from labelrm.v1 import admin_pb2, resource_manager_pb2

from clients import load, load_instance
from clients._errors import RMError
from clients._impl import DEFAULT_TARGET, RMClient, parse_labels

_SIZE_RE = re.compile(r"(\d+)\s*([kmgtp]?)(?:i?b?)", re.IGNORECASE)
_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_STATE_NAMES = {
    resource_manager_pb2.TICKET_STATE_UNSPECIFIED: "-",
    resource_manager_pb2.TICKET_STATE_LOCKED: "LOCKED",
    resource_manager_pb2.TICKET_STATE_USED: "USED",
    resource_manager_pb2.TICKET_STATE_RELEASED: "RELEASED",
    resource_manager_pb2.TICKET_STATE_EXPIRED: "EXPIRED",
}


# --- formatting ------------------------------------------------------------------------------


def to_json(message: Any) -> str:
    """A message as JSON in grpcurl's style (proto field names, proto3 JSON mapping)."""
    return str(json_format.MessageToJson(message, preserving_proto_field_name=True, indent=2))


def fmt_bytes(n: int) -> str:
    """Bytes with a binary suffix when exact (4Gi), plain otherwise."""
    for suffix, power in (("Pi", 5), ("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1)):
        if n and n % (1024**power) == 0:
            return f"{n // 1024**power}{suffix}"
    return str(n)


def fmt_resource(r: Any) -> str:
    """A compact one-line form of a resource_pb2.Resource ("-" when unset)."""
    if r is None:
        return "-"
    kind = r.WhichOneof("kind")
    if kind is None:
        return "-"
    if kind == "special":
        return " ".join(f"{k}={v}" for k, v in sorted(r.special.quantities.items())) or "-"
    if kind == "driver_and_yarn":
        return f"driver({_fmt_dims(r.driver_and_yarn.driver)}) {_fmt_yarn(r.driver_and_yarn.yarn)}"
    if kind == "yarn":
        return _fmt_yarn(r.yarn)
    return _fmt_dims(getattr(r, kind))


def _fmt_dims(m: Any) -> str:
    parts = []
    names = {f.name for f in m.DESCRIPTOR.fields}
    if "memory_bytes" in names:
        parts.append(f"mem={fmt_bytes(m.memory_bytes)}")
    if "cpu_millis" in names:
        parts.append(f"cpu={m.cpu_millis}m")
    if "instances" in names:
        parts.append(f"inst={m.instances}")
    return " ".join(parts)


def _fmt_yarn(y: Any) -> str:
    return (
        f"queue={y.queue_name} mem={fmt_bytes(y.queue_memory_bytes)} "
        f"cpu={y.queue_cpu_millis}m inst={y.queue_instances}"
    )


def _fmt_time(ts: Any) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return str(ts.ToDatetime().strftime("%Y-%m-%dT%H:%M:%SZ"))


def _opt(msg: Any, field: str) -> Any:
    return getattr(msg, field) if msg.HasField(field) else None


def print_table(out: TextIO, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Aligned columns with an upper-case header row, kubectl style."""
    all_rows = [[h.upper() for h in header], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in all_rows) for i in range(len(header))]
    for row in all_rows:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        print("   ".join([*cells, row[-1]]).rstrip(), file=out)


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
    """Bytes from "4294967296", "4G", "4Gi" or "512MiB" (suffixes are binary)."""
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: expected e.g. 1073741824 or 1Gi")
    return int(m.group(1)) << (10 * _UNITS[m.group(2).lower()])


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
    p = argparse.ArgumentParser(prog="rmctl", description="labelrm resource manager client")
    p.add_argument(
        "--rm",
        default=os.environ.get("LABELRM_RM") or DEFAULT_TARGET,
        metavar="HOST:PORT",
        help="RM address (default: $LABELRM_RM or %(default)s)",
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--timeout", type=float, default=10.0, help="per-call deadline in seconds")
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = cmds.add_parser("check", help="check used/locked against live tickets (exit 1 if not)")
    c.set_defaults(func=cmd_check)

    res = cmds.add_parser("resource", help="label resource records").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = res.add_parser("list", help="list resource records")
    c.add_argument("--source", choices=("ecm", "limit"), default="")
    c.set_defaults(func=cmd_resource_list)
    c = res.add_parser("show", help="show one resource record")
    c.add_argument("labels", type=_labels_arg, metavar="LABELS", help='"k=v,k2=v2"')
    c.set_defaults(func=cmd_resource_show)

    tk = cmds.add_parser("ticket", help="tickets").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = tk.add_parser("list", help="list live tickets")
    c.add_argument("--label", default="", help="only tickets charged to this label")
    c.add_argument("--state", choices=("locked", "used"), default=None)
    c.set_defaults(func=cmd_ticket_list)
    c = tk.add_parser("show", help="show one ticket")
    c.add_argument("ticket_id", metavar="ID")
    c.set_defaults(func=cmd_ticket_show)

    lim = cmds.add_parser("limit", help="label limits").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = lim.add_parser("set", help="create or replace a limit")
    c.add_argument("pattern", type=_labels_arg, metavar="PATTERN", help='"k=v,k2=*"')
    c.add_argument("--memory", type=parse_size, required=True, metavar="BYTES")
    c.add_argument("--cpu", type=_non_negative, required=True, metavar="MILLIS")
    c.add_argument("--instances", type=_non_negative, default=None, metavar="N")
    c.set_defaults(func=cmd_limit_set)
    c = lim.add_parser("list", help="list limits")
    c.set_defaults(func=cmd_limit_list)
    c = lim.add_parser("rm", help="delete a limit")
    c.add_argument("pattern", type=_labels_arg, metavar="PATTERN")
    c.set_defaults(func=cmd_limit_rm)
    return p


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
        print_table(
            out,
            ("label", "field", "stored", "expected", "detail"),
            (
                (
                    m.label,
                    m.field,
                    fmt_resource(_opt(m, "stored")),
                    fmt_resource(_opt(m, "expected")),
                    m.detail or "-",
                )
                for m in report.mismatches
            ),
        )
        print(f"inconsistent: {len(report.mismatches)} mismatches", file=sys.stderr)
    return 0 if report.consistent else 1


def cmd_resource_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl resource list`."""
    records = list(client.list_label_resources(source=args.source))
    if args.output == "json":
        resp = resource_manager_pb2.ListLabelResourcesResponse(label_resources=records)
        print(to_json(resp), file=out)
        return 0
    print_table(
        out,
        ("label", "source", "max", "used", "locked", "left", "tickets"),
        (
            (
                r.label,
                r.source,
                fmt_resource(_opt(r, "max_resource")),
                fmt_resource(_opt(r, "used_resource")),
                fmt_resource(_opt(r, "locked_resource")),
                fmt_resource(_opt(r, "left_resource")),
                str(r.live_tickets),
            )
            for r in records
        ),
    )
    return 0


def cmd_resource_show(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl resource show LABELS`."""
    r = client.get_label_resource(args.labels)
    if args.output == "json":
        print(to_json(r), file=out)
        return 0
    rows = [
        ("label", r.label),
        ("source", r.source or "-"),
        ("max", fmt_resource(_opt(r, "max_resource"))),
        ("protected", fmt_resource(_opt(r, "protected_resource"))),
        ("used", fmt_resource(_opt(r, "used_resource"))),
        ("locked", fmt_resource(_opt(r, "locked_resource"))),
        ("left", fmt_resource(_opt(r, "left_resource"))),
        ("tickets", str(r.live_tickets)),
        ("updated", _fmt_time(r.update_time)),
    ]
    print_table(out, ("field", "value"), rows)
    return 0


def _ticket_row(t: Any) -> tuple[str, ...]:
    return (
        t.ticket_id,
        _STATE_NAMES.get(t.state, str(t.state)),
        t.user or "-",
        ";".join(t.charged_labels) or "-",
        fmt_resource(_opt(t, "requested_resource")),
        fmt_resource(_opt(t, "used_resource")),
        _fmt_time(t.create_time),
    )


_TICKET_HEADER = ("ticket_id", "state", "user", "charged", "requested", "used", "created")


def cmd_ticket_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket list`."""
    tickets = list(client.list_tickets(label=args.label, state=args.state))
    if args.output == "json":
        print(to_json(resource_manager_pb2.ListTicketsResponse(tickets=tickets)), file=out)
        return 0
    print_table(out, _TICKET_HEADER, (_ticket_row(t) for t in tickets))
    return 0


def cmd_ticket_show(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket show ID`."""
    t = client.get_ticket(args.ticket_id)
    if args.output == "json":
        print(to_json(t), file=out)
        return 0
    print_table(out, _TICKET_HEADER, [_ticket_row(t)])
    return 0


def cmd_limit_set(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl limit set PATTERN --memory BYTES --cpu MILLIS [--instances N]`."""
    if args.instances is None:
        maximum = load(args.memory, args.cpu)
    else:
        maximum = load_instance(args.memory, args.cpu, args.instances)
    limit = client.set_label_limit(args.pattern, maximum)
    if args.output == "json":
        print(to_json(limit), file=out)
        return 0
    print_table(
        out,
        ("pattern", "max", "updated"),
        [(limit.pattern, fmt_resource(_opt(limit, "max_resource")), _fmt_time(limit.update_time))],
    )
    return 0


def cmd_limit_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl limit list`."""
    limits = list(client.list_label_limits())
    if args.output == "json":
        print(to_json(admin_pb2.ListLabelLimitsResponse(limits=limits)), file=out)
        return 0
    print_table(
        out,
        ("pattern", "max", "updated"),
        (
            (lim.pattern, fmt_resource(_opt(lim, "max_resource")), _fmt_time(lim.update_time))
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


def report_error(err: RMError, stream: TextIO) -> None:
    """`error: <CODE>: <message>`, plus one line per shortfall of a refusal."""
    print(f"error: {err.code.name}: {err.message}", file=stream)
    for shortfall in getattr(err, "shortfalls", ()):
        print(f"  shortfall: {shortfall}", file=stream)


def main(argv: Sequence[str] | None = None) -> int:
    """Run rmctl; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    func: Command = args.func
    try:
        with RMClient(args.rm, timeout=args.timeout) as client:
            return func(client, args, sys.stdout)
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
