"""`rmctl ticket apply|use|release|list|show`: tickets, the resource locks the RM hands
out: apply for one (LOCKED), report it used (USED), release it when the work is done."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from labelrm.v1 import resource_manager_pb2

from labelrm_client import RMClient
from rmctl.args import (
    add_resource_args,
    add_selector,
    labels_arg,
    resource_arg,
    resource_update,
    selected,
    state_arg,
)
from rmctl.format import (
    STATE_NAMES,
    fmt_labels,
    fmt_resource,
    fmt_time,
    opt,
    print_details,
    print_json,
    print_list,
    visible,
)
from rmctl.resolve import resolve_ticket

__all__ = ["register", "show_ticket"]


def register(cmds: Any) -> None:
    """Register ``rmctl ticket ...`` on rmctl's sub-command parsers."""
    tk = cmds.add_parser("ticket", aliases=["tickets"], help="tickets").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = tk.add_parser("list", help="list live tickets")
    c.add_argument("--label", default="", help="only tickets charged to this label")
    c.add_argument("--state", type=state_arg(("locked", "used")), default=None)
    add_selector(c)
    c.add_argument(
        "-w", "--watch", action="store_true", help="re-render until interrupted (Ctrl-C)"
    )
    c.set_defaults(func=cmd_ticket_list)
    c = tk.add_parser("show", help="show one ticket")
    c.add_argument("ticket_id", metavar="ID", help="a ticket id, or a unique prefix of a live one")
    c.set_defaults(func=cmd_ticket_show)

    c = tk.add_parser(
        "apply",
        help="lock a resource on labels: a LOCKED ticket (Apply)",
        description="Lock --memory/--cpu (and --instances) on every resource-carrying label "
        "of LABELS. Refused at once when it does not fit, unless --wait gives the RM time "
        "to find room.",
    )
    c.add_argument("--labels", type=labels_arg, required=True, metavar="LABELS")
    add_resource_args(c)
    c.add_argument("--user", default="", help="on whose behalf (proxy users and admins)")
    c.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="wait this long for room"
    )
    c.add_argument("-q", "--quiet", action="store_true", help="print only the ticket id")
    c.set_defaults(func=cmd_ticket_apply)

    c = tk.add_parser(
        "use",
        aliases=["report-used"],
        help="report a LOCKED ticket used: USED (ReportUsed)",
        description="Turn a LOCKED ticket into USED: all of it, or what --memory / --cpu "
        "say (a dimension not given counts in full).",
    )
    c.add_argument("ticket_id", metavar="ID", help="a ticket id, or a unique prefix of a live one")
    add_resource_args(c, required=False)
    c.set_defaults(func=cmd_ticket_use)

    c = tk.add_parser(
        "release",
        aliases=["delete", "rm"],
        help="release a ticket: its resource is free again (Release; idempotent)",
    )
    c.add_argument("ticket_ids", nargs="+", metavar="ID", help="ticket ids or unique prefixes")
    c.set_defaults(func=cmd_ticket_release)


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


def cmd_ticket_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket list`."""
    tickets = selected(client.list_tickets(label=args.label, state=args.state), args.selector)
    resp = resource_manager_pb2.ListTicketsResponse(tickets=tickets)
    return print_list(out, args.output, resp, tickets, _ticket_row, (_TICKET_HEADER, _TICKET_WIDE))


def show_ticket(t: Any, output: str, out: TextIO) -> None:
    """The detail view of a ticket (JSON with ``-o json``)."""
    if print_json(out, output, t):
        return
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


def cmd_ticket_show(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket show ID`."""
    show_ticket(resolve_ticket(client, args.ticket_id), args.output, out)
    return 0


def cmd_ticket_apply(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket apply --labels L --memory M --cpu C [--instances N] [--wait S]`."""
    t = client.apply(args.labels, resource_arg(args), wait_timeout=args.wait, user=args.user)
    if args.quiet:
        print(t.ticket_id, file=out)
    else:
        show_ticket(t, args.output, out)
    return 0


def cmd_ticket_use(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket use ID [--memory M --cpu C]`: ReportUsed."""
    given = resolve_ticket(client, args.ticket_id)
    used = resource_update(args, opt(given, "requested_resource"), f"ticket {given.ticket_id}")
    t = client.report_used(given.ticket_id, used)
    if not print_json(out, args.output, t):
        print(f"{t.ticket_id} {STATE_NAMES.get(t.state, str(t.state))}: "
              f"{fmt_resource(opt(t, 'used_resource'))} used", file=out)  # fmt: skip
    return 0


def cmd_ticket_release(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl ticket release ID...`: each released (a finished one is left as it ended)."""
    for given in args.ticket_ids:
        t = client.release(resolve_ticket(client, given).ticket_id)
        if print_json(out, args.output, t):
            continue
        state = STATE_NAMES.get(t.state, str(t.state))
        ended = f": {visible(t.end_reason)}" if t.end_reason else ""
        print(f"{t.ticket_id} {state}{ended}", file=out)
    return 0
