"""`rmctl describe engineconn|node|ticket|demand ID`: the object, then its Events.

Like `kubectl describe`: the detail view of the object, followed by every state it entered
with the time and the reason, from what the RM records (ListEvents: the state
history of ECMs and EngineConns, a ticket's own times and end reason, a demand's
transitions).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from clients._filters import fmt_age
from clients._format import fmt_time, print_table
from clients._impl import RMClient

__all__ = ["add_describe_commands"]


def add_describe_commands(cmds: Any) -> None:
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
    # Imported here: these modules import rmctl, which imports this one.
    from clients.rmctl import cmd_ticket_show, resolve_ticket
    from clients.rmctl_demand import show_demand_details
    from clients.rmctl_engineconn import cmd_ec_status, resolve_engine_conn
    from clients.rmctl_node import cmd_node_status, resolve_ecm

    user = ""
    if args.kind == "demand":
        d = show_demand_details(client, args.object_id, args.user, args.output, out)
        object_id, user = d.demand_id, d.user
    elif args.kind == "ticket":
        object_id = resolve_ticket(client, args.object_id).ticket_id
        cmd_ticket_show(client, argparse.Namespace(**vars(args), ticket_id=object_id), out)
    elif args.kind == "engineconn":
        object_id = resolve_engine_conn(client, args.object_id).engine_conn_id
        cmd_ec_status(client, argparse.Namespace(**vars(args), ec_id=object_id), out)
    else:
        object_id = resolve_ecm(client, args.object_id).instance
        cmd_node_status(client, argparse.Namespace(**vars(args), name=object_id), out)
    if args.output in ("table", "wide"):
        events = client.list_events(args.kind, object_id, user)
        print_events([(e.time, e.state, e.reason) for e in events], out)
    return 0
