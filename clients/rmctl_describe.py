"""`rmctl describe engineconn|node|ticket|demand ID`: the object, then its Events.

Like `kubectl describe`: the detail view of the object, followed by every state it entered
with the time and the reason, from what the RM records (ListEvents for ECMs and
EngineConns; a ticket's own times and end reason; a demand's transitions).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from clients._filters import fmt_age
from clients._format import STATE_NAMES, fmt_time, print_table
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


def _ticket_events(t: Any) -> list[tuple[Any, str, str]]:
    events = [(t.create_time, "LOCKED", "applied")]
    if t.HasField("used_resource") and t.used_resource.WhichOneof("kind"):
        events.append((t.update_time, "USED", "reported used"))
    if t.end_time.seconds:
        events.append((t.end_time, STATE_NAMES.get(t.state, str(t.state)), t.end_reason))
    return events


def cmd_describe(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl describe KIND ID`."""
    # Imported here: these modules import rmctl, which imports this one.
    from clients.rmctl import cmd_ticket_show, resolve_ticket
    from clients.rmctl_demand import cmd_demand_show
    from clients.rmctl_engineconn import cmd_ec_status, resolve_engine_conn
    from clients.rmctl_node import cmd_node_status, resolve_ecm

    if args.kind == "demand":
        # A demand's own view already lists every transition with its time and reason.
        return cmd_demand_show(
            client, argparse.Namespace(**vars(args), demand_id=args.object_id), out
        )
    if args.kind == "ticket":
        t = resolve_ticket(client, args.object_id)
        cmd_ticket_show(client, argparse.Namespace(**vars(args), ticket_id=t.ticket_id), out)
        events = _ticket_events(t)
    elif args.kind == "engineconn":
        ec = resolve_engine_conn(client, args.object_id)
        cmd_ec_status(client, argparse.Namespace(**vars(args), ec_id=ec.engine_conn_id), out)
        events = [
            (e.time, e.state, e.reason) for e in client.list_events("engineconn", ec.engine_conn_id)
        ]
    else:
        e = resolve_ecm(client, args.object_id)
        cmd_node_status(client, argparse.Namespace(**vars(args), name=e.instance), out)
        events = [(ev.time, ev.state, ev.reason) for ev in client.list_events("node", e.instance)]
    if args.output in ("table", "wide"):
        print_events(events, out)
    return 0
