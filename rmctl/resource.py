"""`rmctl resource list|show`: the label resource records (an ECM's, a limit's, an external
queue's)."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from labelrm.v1 import resource_manager_pb2

from labelrm_client import NotFound, RMClient, labels_from
from rmctl.args import add_selector, labels_arg, matches
from rmctl.format import (
    fmt_resource,
    fmt_time,
    opt,
    print_details,
    print_json,
    print_table,
    to_json,
)

__all__ = ["register"]


def register(cmds: Any) -> None:
    """Register ``rmctl resource ...`` on rmctl's sub-command parsers."""
    res = cmds.add_parser(
        "resource", aliases=["resources"], help="label resource records"
    ).add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")
    c = res.add_parser("list", help="list resource records")
    c.add_argument("--source", choices=("ecm", "limit", "external"), default="")
    add_selector(c)
    c.add_argument(
        "-w", "--watch", action="store_true", help="re-render until interrupted (Ctrl-C)"
    )
    c.set_defaults(func=cmd_resource_list)
    c = res.add_parser("show", help="show one resource record")
    c.add_argument("labels", type=labels_arg, metavar="LABELS", help='"k=v,k2=v2"')
    c.set_defaults(func=cmd_resource_show)


def cmd_resource_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl resource list`."""
    records = [
        r
        for r in client.list_label_resources(source=args.source)
        if matches(labels_from(r.label), args.selector)
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
            if {(lb.key, lb.value) for lb in labels_from(rec.label)} == wanted
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
