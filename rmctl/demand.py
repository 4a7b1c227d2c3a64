"""`rmctl demand submit|list|show|cancel|claim`: time-aware demands (docs/demands.md).

The commands have rmctl's signature ``(client, args, out) -> exit code`` and call the SDK's
demand methods (submit_demand, list_demands, get_demand, cancel_demand, claim_demand).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from labelrm.v1 import demand_pb2

from labelrm_client import RMClient
from labelrm_client._requests import DEMAND_STATES as STATES
from rmctl.args import (
    add_resource_args,
    add_selector,
    labels_arg,
    resource_arg,
    selected,
    state_arg,
)
from rmctl.format import (
    fmt_labels,
    fmt_resource,
    fmt_time,
    opt,
    print_details,
    print_json,
    print_list,
    print_table,
    visible,
)
from rmctl.format import to_json as _to_json

_STATE_NAMES = {v: k.upper() for k, v in STATES.items()}

EXAMPLE = "{DemandID: 1234, OrderBy: 1200, Duration: {Time: [NOW, +20m], Strategy: loose}}"


def register(cmds: Any) -> None:
    """Register ``rmctl demand ...`` on rmctl's sub-command parsers (``add_subparsers()``)."""
    dem = cmds.add_parser("demand", aliases=["demands"], help="time-aware demands").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = dem.add_parser(
        "submit",
        help="submit a demand (idempotent by ID)",
        description=f"Submit a time-aware demand. Example conditions: {EXAMPLE}",
    )
    c.add_argument("demand_id", metavar="ID", help="client-chosen id (the idempotency key)")
    c.add_argument("--labels", type=labels_arg, required=True, metavar="LABELS")
    add_resource_args(c)
    c.add_argument("--user", default="", help="on whose behalf")
    when = c.add_mutually_exclusive_group()
    when.add_argument(
        "--when",
        default="",
        metavar="CONDITIONS",
        help="time conditions in the paper's JSON, e.g. '{Start: [NOW, +5m]}'",
    )
    when.add_argument(
        "--when-file", default="", metavar="FILE", help="read the conditions from FILE (- = stdin)"
    )
    c.set_defaults(func=cmd_demand_submit)

    c = dem.add_parser("list", help="list demands")
    c.add_argument(
        "--state", type=state_arg(STATES), default=None, metavar="STATE",
        help=f"only in this state, any case: {', '.join(sorted(STATES))}",
    )  # fmt: skip
    c.add_argument("--user", default="")
    add_selector(c)
    c.add_argument("-w", "--watch", action="store_true", help="re-render until interrupted")
    c.set_defaults(func=cmd_demand_list)

    c = dem.add_parser("show", help="show one demand and its history")
    c.add_argument("demand_id", metavar="ID")
    c.add_argument("--user", default="", help="whose demand (ids are per user; admins only)")
    c.set_defaults(func=cmd_demand_show)

    c = dem.add_parser("cancel", aliases=["delete"], help="cancel a demand (it becomes FAILED)")
    c.add_argument("demand_id", metavar="ID")
    c.add_argument("--reason", default="", help="recorded in the demand's history")
    c.add_argument("--user", default="", help="whose demand (ids are per user; admins only)")
    c.set_defaults(func=cmd_demand_cancel)

    c = dem.add_parser("claim", help="claim an ALLOCATED demand; prints its ticket")
    c.add_argument("demand_id", metavar="ID")
    c.add_argument("--user", default="", help="whose demand (ids are per user; admins only)")
    c.set_defaults(func=cmd_demand_claim)


def _state(value: int) -> str:
    return str(_STATE_NAMES.get(value, value))


def _row(d: Any, wide: bool) -> tuple[str, ...]:
    row: tuple[str, ...] = (
        d.demand_id,
        _state(d.state),
        d.user or "-",
        fmt_resource(opt(d, "resource")),
        fmt_time(d.planned_start_time),
        d.ticket_id or "-",
        d.waiting or d.reason or "-",  # what an ACCEPTED demand's OrderBy waits for
    )
    if wide:
        row += (str(d.passed_over_rounds), ";".join(d.charged_labels) or "-")
    return row


_HEADER = ("demand_id", "state", "user", "resource", "planned_start", "ticket", "reason")
_WIDE = (*_HEADER, "rounds", "charged")


def _details(d: Any) -> list[tuple[str, str]]:
    return [
        ("demand_id", d.demand_id),
        ("state", _state(d.state)),
        ("reason", d.reason or "-"),
        ("waiting", d.waiting or "-"),
        ("user", d.user or "-"),
        ("labels", fmt_labels(d.labels)),
        ("charged", ";".join(d.charged_labels) or "-"),
        ("resource", fmt_resource(opt(d, "resource"))),
        ("conditions", d.time_conditions_text),
        ("submitted", fmt_time(d.submit_time)),
        ("planned_start", fmt_time(d.planned_start_time)),
        ("plan", f"{fmt_time(d.plan_start_time)} .. {fmt_time(d.plan_end_time)}"),
        ("slip", f"{d.slip.seconds}s" if d.slip.seconds else "-"),
        ("passed_over", str(d.passed_over_rounds)),
        ("ticket", d.ticket_id or "-"),
        ("allocated", fmt_time(d.allocate_time)),
        ("claim_expires", fmt_time(d.claim_expire_time)),
        ("claimed", fmt_time(d.claim_time)),
        ("ended", fmt_time(d.end_time)),
        ("overruns", ",".join(d.overruns) or "-"),
    ]


def _print_demand(d: Any, out: TextIO) -> None:
    print_details(out, _details(d))
    if d.events:
        print(file=out)
        print_table(
            out,
            ("time", "from", "to", "reason"),
            (
                (
                    fmt_time(e.time),
                    _state(e.from_state) if e.from_state else "-",
                    _state(e.to_state),
                    e.reason,
                )
                for e in d.events
            ),
        )


def cmd_demand_submit(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl demand submit ID --labels L --memory M --cpu C [--when TEXT | --when-file F]`."""
    text = args.when
    if args.when_file:
        if args.when_file == "-":
            text = sys.stdin.read()
        else:
            with open(args.when_file, encoding="utf-8") as fh:
                text = fh.read()
    resource = resource_arg(args)
    resp = client.submit_demand(args.demand_id, args.labels, resource, text, args.user)
    if print_json(out, args.output, resp):
        return 0
    verb = "submitted" if resp.created else "already submitted"
    print(f"{verb}: {visible(resp.demand.demand_id)} {_state(resp.demand.state)}", file=out)
    print_details(out, _details(resp.demand)[1:])
    return 0


def cmd_demand_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl demand list [--state S] [--user U] [-l k=v,...]`."""
    demands = selected(client.list_demands(state=args.state, user=args.user), args.selector)
    resp = demand_pb2.ListDemandsResponse(demands=demands)
    return print_list(out, args.output, resp, demands, _row, (_HEADER, _WIDE))


def cmd_demand_show(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl demand show ID`: the demand and every transition with its time and reason."""
    d = client.get_demand(args.demand_id, args.user)
    if print_json(out, args.output, d):
        return 0
    _print_demand(d, out)
    return 0


def show_demand_details(
    client: RMClient, demand_id: str, user: str, output: str, out: TextIO
) -> Any:
    """Print a demand's fields (JSON for ``-o json``), without its transitions (`rmctl
    describe demand` prints them as Events); returns the Demand."""
    d = client.get_demand(demand_id, user)
    if output == "json":
        print(_to_json(d), file=out)
    else:
        print_details(out, _details(d))
    return d


def cmd_demand_cancel(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl demand cancel ID [--reason TEXT]`."""
    d = client.cancel_demand(args.demand_id, args.reason, args.user)
    if args.output == "json":
        print(_to_json(d), file=out)
    else:
        print(f"{visible(d.demand_id)} {_state(d.state)}: {visible(d.reason)}", file=out)
    return 0


def cmd_demand_claim(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl demand claim ID`: the demand moves to MONITORING; prints its ticket."""
    resp = client.claim_demand(args.demand_id, args.user)
    if args.output == "json":
        print(_to_json(resp), file=out)
    else:
        print(f"{visible(resp.demand.demand_id)} claimed: ticket {resp.ticket.ticket_id}", file=out)
    return 0
