"""`rmctl node list|status|refresh|rm`, with `cordon|uncordon|drain|decommission`
(rmctl/drain.py): the ECMs (agents) as the RM sees them.

The commands have rmctl's signature ``(client, args, out) -> exit code``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, TextIO

from labelrm.v1 import admin_pb2, resource_manager_pb2

from labelrm_client import RMClient
from labelrm_client._engineconn import LIVE_EC_STATES, ec_state_name, ecm_state_name
from rmctl.args import LOST_NODE_AGE_OUT, add_selector, add_sort_by, selected, sort_rows
from rmctl.drain import add_drain_commands, node_state
from rmctl.format import (
    fmt_isolation,
    fmt_labels,
    fmt_resource,
    fmt_time,
    fmt_usage,
    opt,
    print_details,
    print_json,
    print_list,
    print_table,
    to_json,
)
from rmctl.resolve import resolve_ecm

__all__ = ["register", "show_node"]


def register(cmds: Any) -> None:
    """Register ``rmctl node ...`` on rmctl's sub-command parsers (``add_subparsers()``)."""
    node = cmds.add_parser(
        "node",
        aliases=["nodes"],
        help="ECMs (agents): list, status, cordon, drain, decommission, node lists",
    )
    sub = node.add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")

    c = sub.add_parser(
        "list",
        help="list the registered ECMs",
        description="ECMs LOST for more than an hour (since their last heartbeat) are left "
        "out unless -A; `rmctl node rm` removes them for good.",
    )
    c.add_argument("-A", "--all", action="store_true", help="long-LOST ECMs too")
    add_selector(c)
    add_sort_by(c, list(_SORT_KEYS))
    c.add_argument(
        "-w", "--watch", action="store_true", help="re-render until interrupted (Ctrl-C)"
    )
    c.set_defaults(func=cmd_node_list)

    c = sub.add_parser(
        "rm",
        aliases=["delete"],
        help="remove a LOST or decommissioned ECM from the RM (its agent is gone for good)",
    )
    c.add_argument("name", metavar="NAME", help="an ECM instance, or a unique prefix of one")
    c.set_defaults(func=cmd_node_rm)

    c = sub.add_parser("status", help="show one ECM and its live EngineConns")
    c.add_argument("name", metavar="NAME", help="an ECM instance, or a unique prefix of one")
    c.set_defaults(func=cmd_node_status)

    add_drain_commands(sub)

    c = sub.add_parser(
        "refresh",
        help="replace the include and exclude lists (takes effect at once)",
        description=(
            "Replace both node lists (YARN's refreshNodes). Entries are ECM instances or "
            "host names; an empty include list allows every ECM that is not excluded; "
            "exclusion wins. Without options both lists are cleared."
        ),
    )
    for name in ("include", "exclude"):
        c.add_argument(
            f"--{name}",
            action="extend",
            type=_node_list,
            default=[],
            metavar="HOST[,HOST...]",
            help=f"{name} these (repeatable, or comma-separated)",
        )
    c.set_defaults(func=cmd_node_refresh)


def _node_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


_HEADER = ("instance", "state", "isolation", "engineconns", "total", "left", "last_heartbeat")
_WIDE = (*_HEADER, "labels", "protected", "registered")


def _row(e: Any, wide: bool) -> tuple[str, ...]:
    row: tuple[str, ...] = (
        e.instance,
        node_state(e),
        fmt_isolation(opt(e, "isolation")),
        str(e.live_engine_conns),
        fmt_resource(opt(e, "total_resource")),
        fmt_resource(opt(e, "left_resource")),
        fmt_time(e.last_heartbeat_time),
    )
    if wide:
        row += (
            fmt_labels(e.labels),
            fmt_resource(opt(e, "protected_resource")),
            fmt_time(e.register_time),
        )
    return row


_SORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "instance": lambda e: e.instance,
    "state": lambda e: ecm_state_name(e.state),
    "engineconns": lambda e: -e.live_engine_conns,  # busiest first
    "last_heartbeat": lambda e: (-e.last_heartbeat_time.seconds, -e.last_heartbeat_time.nanos),
}


def _aged_out(e: Any, now: float) -> bool:
    """A LOST ECM whose last heartbeat is more than LOST_NODE_AGE_OUT seconds old."""
    last = e.last_heartbeat_time.seconds or e.update_time.seconds
    return bool(e.state == resource_manager_pb2.ECM_STATE_LOST and now - last > LOST_NODE_AGE_OUT)


def cmd_node_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl node list [-A] [-l K=V] [--sort-by COLUMN]`."""
    now = time.time()
    ecms = [
        e for e in selected(client.list_ecms(), args.selector) if args.all or not _aged_out(e, now)
    ]
    ecms = sort_rows(ecms, args.sort_by, _SORT_KEYS)
    resp = resource_manager_pb2.ListEcmsResponse(ecms=ecms)
    return print_list(out, args.output, resp, ecms, _row, (_HEADER, _WIDE))


def cmd_node_status(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl node status NAME`: the ECM, then its live EngineConns."""
    show_node(client, resolve_ecm(client, args.name), args.output, out)
    return 0


def show_node(client: RMClient, e: Any, output: str, out: TextIO) -> None:
    """The detail view of an ECM and a table of its live EngineConns (JSON: the ECM)."""
    if print_json(out, output, e):
        return
    print_details(
        out,
        [
            ("instance", e.instance),
            ("state", node_state(e)),
            ("cordoned", f"yes: {e.cordon_reason or '-'}" if e.cordoned else "no"),
            ("isolation", fmt_isolation(opt(e, "isolation"), full=True)),
            ("labels", fmt_labels(e.labels)),
            ("total", fmt_resource(opt(e, "total_resource"))),
            ("protected", fmt_resource(opt(e, "protected_resource"))),
            ("left", fmt_resource(opt(e, "left_resource"))),
            ("engineconns", str(e.live_engine_conns)),
            ("last_heartbeat", fmt_time(e.last_heartbeat_time)),
            ("registered", fmt_time(e.register_time)),
            ("updated", fmt_time(e.update_time)),
        ],
    )
    # One filtered query per live state: the ended EngineConns of a long-lived ECM can be
    # many, and the server filters cheaper than we do.
    live = sorted(
        (ec for st in LIVE_EC_STATES for ec in client.list_engine_conns(ecm=e.instance, state=st)),
        key=lambda ec: str(ec.engine_conn_id),
    )
    if live:
        print(file=out)
        print_table(
            out,
            ("engine_conn_id", "state", "user", "granted", "measured", "address"),
            (
                (
                    ec.engine_conn_id,
                    ec_state_name(ec.state),
                    ec.user,
                    fmt_resource(opt(ec, "granted_resource")),
                    fmt_usage(opt(ec, "measured")),
                    ec.address or "-",
                )
                for ec in live
            ),
        )


def cmd_node_refresh(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl node refresh [--include H...] [--exclude H...]` (RefreshNodes)."""
    disallowed = client.refresh_nodes(args.include, args.exclude)
    if args.output == "json":
        resp = admin_pb2.RefreshNodesResponse(disallowed_instances=disallowed)
        print(to_json(resp), file=out)
        return 0
    print_details(
        out,
        [
            ("include", ",".join(args.include) or "(all)"),
            ("exclude", ",".join(args.exclude) or "-"),
            ("disallowed", ",".join(disallowed) or "-"),
        ],
    )
    return 0


def cmd_node_rm(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl node rm NAME`: UnregisterEcm for an ECM that is LOST, or decommissioned
    empty."""
    e = resolve_ecm(client, args.name)
    lost = e.state == resource_manager_pb2.ECM_STATE_LOST
    drained = e.state == resource_manager_pb2.ECM_STATE_DRAINING and not e.live_engine_conns
    if not (lost or drained):
        raise ValueError(
            f"ECM {e.instance} is {ecm_state_name(e.state)} with {e.live_engine_conns} live "
            "EngineConns: only a LOST or decommissioned (DRAINING, none live) ECM can be "
            f"removed; decommission it first (rmctl node decommission {e.instance})"
        )
    released = client.unregister_ecm(e.instance)
    if args.output == "json":
        print(
            to_json(resource_manager_pb2.UnregisterEcmResponse(released_ticket_ids=released)),
            file=out,
        )
    else:
        print(f"removed {e.instance} ({len(released)} tickets released)", file=out)
    return 0
