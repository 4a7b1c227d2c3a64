"""`rmctl ticket list|show`: tickets, the resource locks the RM hands out."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from labelrm.v1 import resource_manager_pb2

from clients import RMClient
from rmctl.args import add_selector, selected, state_arg
from rmctl.format import (
    STATE_NAMES,
    fmt_labels,
    fmt_resource,
    fmt_time,
    opt,
    print_details,
    print_json,
    print_list,
)
from rmctl.resolve import resolve_by_prefix

__all__ = ["register", "resolve_ticket", "show_ticket"]


def register(cmds: Any) -> None:
    """Register ``rmctl ticket ...`` on rmctl's sub-command parsers."""
    tk = cmds.add_parser("ticket", help="tickets").add_subparsers(
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
    return resolve_by_prefix(
        "ticket id", given, client.get_ticket, client.list_tickets, lambda t: str(t.ticket_id)
    )


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
