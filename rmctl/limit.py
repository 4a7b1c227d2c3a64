"""`rmctl limit set|list|rm`: the maximum of a label pattern."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from labelrm.v1 import admin_pb2

from labelrm_client import RMClient
from rmctl.args import add_resource_args, labels_arg, resource_update
from rmctl.format import fmt_resource, fmt_time, opt, print_json, print_table, to_json

__all__ = ["register"]


def register(cmds: Any) -> None:
    """Register ``rmctl limit ...`` on rmctl's sub-command parsers."""
    lim = cmds.add_parser("limit", aliases=["limits"], help="label limits").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = lim.add_parser(
        "set",
        help="create a limit, or change the dimensions given of one",
        description="A new limit needs --memory and --cpu; on an existing one each "
        "dimension not given keeps its value (`limit set P --memory 1Gi` changes only "
        "the memory).",
    )
    c.add_argument("pattern", type=labels_arg, metavar="PATTERN", help='"k=v,k2=*"')
    add_resource_args(c, required=False)
    c.set_defaults(func=cmd_limit_set)
    c = lim.add_parser("list", help="list limits")
    c.add_argument(
        "-w", "--watch", action="store_true", help="re-render until interrupted (Ctrl-C)"
    )
    c.set_defaults(func=cmd_limit_list)
    c = lim.add_parser("rm", aliases=["delete"], help="delete a limit")
    c.add_argument("pattern", type=labels_arg, metavar="PATTERN")
    c.set_defaults(func=cmd_limit_rm)


def cmd_limit_set(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl limit set PATTERN [--memory QUANTITY] [--cpu QUANTITY] [--instances N]`."""
    wanted = {(lb.key, lb.value) for lb in args.pattern}
    current = next(
        (lim for lim in client.list_label_limits()
         if {(lb.key, lb.value) for lb in lim.labels} == wanted),
        None,
    )  # fmt: skip
    shown = ",".join(f"{lb.key}={lb.value}" for lb in args.pattern)
    what = f"limit {current.pattern}" if current is not None else f"new limit {shown}"
    resource = resource_update(args, opt(current, "max_resource") if current else None, what)
    if resource is None:
        raise ValueError(f"nothing to set on {what}: give --memory, --cpu or --instances")
    limit = client.set_label_limit(args.pattern, resource)
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
