"""`rmctl describe engineconn|node|ticket|demand ID`: the object, then its Events.

Like `kubectl describe`: the detail view of the object, followed by every state it entered
with the time and the reason, from what the RM records (ListEvents: the state
history of ECMs and EngineConns, a ticket's own times and end reason, a demand's
transitions).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

import grpc
from labelrm.v1 import admin_pb2

from labelrm_client import NotFound, RMClient
from rmctl.demand import show_demand_details
from rmctl.engineconn import show_engine_conn
from rmctl.format import fmt_age, fmt_time, print_details, print_table, to_json
from rmctl.node import show_node
from rmctl.resolve import resolve_ecm, resolve_engine_conn, resolve_ticket
from rmctl.ticket import show_ticket

__all__ = ["register"]


def register(cmds: Any) -> None:
    """Register ``rmctl describe KIND ID``."""
    c = cmds.add_parser(
        "describe", help="an EngineConn, node, ticket or demand with its event history"
    )
    c.add_argument("kind", choices=("engineconn", "node", "ticket", "demand"))
    c.add_argument("object_id", metavar="ID", help="its id or name, or a unique prefix")
    c.add_argument("--user", default="", help="a demand's user (admins only)")
    c.set_defaults(func=cmd_describe)


def print_events(events: list[tuple[Any, str, str]], out: TextIO) -> None:
    """The Events section: time, age, state, reason (oldest first)."""
    print("\nEvents:", file=out)
    if not events:
        print("  <none>", file=out)
        return
    print_table(
        out,
        ("time", "age", "state", "reason"),
        ((fmt_time(ts), fmt_age(ts), state, " ".join(reason.split()) or "-")
         for ts, state, reason in events),
    )  # fmt: skip


def cmd_describe(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl describe KIND ID`: the object's own view, then its Events (ListEvents)."""
    user = ""
    if args.kind == "demand":
        d = show_demand_details(client, args.object_id, args.user, args.output, out)
        object_id, user = d.demand_id, d.user
    elif args.kind == "ticket":
        ticket = resolve_ticket(client, args.object_id)
        object_id = ticket.ticket_id
        show_ticket(ticket, args.output, out)
    elif args.kind == "engineconn":
        ec = resolve_engine_conn(client, args.object_id)
        object_id = ec.engine_conn_id
        show_engine_conn(ec, args.output, out)
    else:
        try:
            ecm = resolve_ecm(client, args.object_id)
        except NotFound:
            return _describe_departed_node(client, args, out)
        object_id = ecm.instance
        show_node(client, ecm, args.output, out)
    if args.output in ("table", "wide"):
        events = client.list_events(args.kind, object_id, user)
        print_events([(e.time, e.state, e.reason) for e in events], out)
    return 0


def _describe_departed_node(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """A node no longer registered: its history, which outlives it (NotFound when it has
    none: it never was, or its history is past the retention)."""
    events = client.list_events("node", args.object_id)
    if not events:
        raise NotFound(
            grpc.StatusCode.NOT_FOUND,
            f"ECM {args.object_id} is not registered and has no history (the name must be "
            "whole for a node that left)",
        )
    if args.output == "json":
        print(to_json(admin_pb2.ListEventsResponse(events=events)), file=out)
        return 0
    left = events[-1]
    gone = f"not registered: {left.state} {fmt_time(left.time)}" if left.state == "LEFT" else (
        "not registered"
    )  # fmt: skip
    print_details(out, [("instance", args.object_id), ("state", gone)])
    print_events([(e.time, e.state, e.reason) for e in events], out)
    return 0
