"""`rmctl status` (the cluster at a glance), `rmctl top` (usage by user or by label) and
`rmctl check` (the RM's bookkeeping against its live tickets).

`status` is what `nomad status`, `sinfo` and `kubectl get nodes` plus `top` give together,
on one screen: the RM (GetClusterInfo: version, replicas, database, waiting applies), the
nodes and EngineConns by state, the used / locked / left totals over the ECMs, the demands
by state and the most loaded labels. `top` sums the live tickets per user, or ranks the
label records by load.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any, TextIO

from labelrm.v1 import demand_pb2, resource_manager_pb2

from labelrm_client import RMClient, labels_from
from labelrm_client._engineconn import LIVE_EC_STATES, ec_state_name, ecm_state_name
from labelrm_common.quantity import format_bytes, format_cpu
from labelrm_common.version import VERSION
from rmctl.format import (
    fmt_age,
    fmt_resource,
    fmt_time,
    opt,
    print_details,
    print_json,
    print_table,
    to_json,
)

__all__ = ["register"]

_DIMS = ("memory_bytes", "cpu_millis", "instances")


def register(cmds: Any) -> None:
    """Register ``rmctl status``, ``rmctl top`` and ``rmctl check``."""
    c = cmds.add_parser("status", help="the cluster at a glance: RM, nodes, EngineConns, usage")
    c.add_argument("--top", type=int, default=5, metavar="N", help="most loaded labels shown")
    c.set_defaults(func=cmd_status)
    c = cmds.add_parser("top", help="resource usage by user or by label, largest first")
    c.add_argument("--by", choices=("user", "label"), default="user")
    c.set_defaults(func=cmd_top)
    c = cmds.add_parser("check", help="check used/locked against live tickets (exit 1 if not)")
    c.set_defaults(func=cmd_check)


def dims(resource: Any) -> dict[str, int]:
    """memory_bytes, cpu_millis and instances of a Resource message, whatever its kind."""
    out = dict.fromkeys(_DIMS, 0)
    if resource is None or resource.WhichOneof("kind") is None:
        return out
    inner = getattr(resource, str(resource.WhichOneof("kind")))
    names = {f.name for f in inner.DESCRIPTOR.fields}
    for d in _DIMS:
        if d in names:
            out[d] = int(getattr(inner, d))
    return out


def _sum(resources: Iterable[Any]) -> dict[str, int]:
    total = dict.fromkeys(_DIMS, 0)
    for r in resources:
        for d, v in dims(r).items():
            total[d] += v
    return total


def fmt_dims(d: dict[str, int]) -> str:
    return (
        f"mem={format_bytes(d['memory_bytes'])} cpu={format_cpu(d['cpu_millis'])} "
        f"inst={d['instances']}"
    )


def load_of(record: Any) -> float:
    """The largest fraction (used + locked) / max over a record's dimensions."""
    top = dims(record.max_resource if record.HasField("max_resource") else None)
    used = dims(record.used_resource if record.HasField("used_resource") else None)
    locked = dims(record.locked_resource if record.HasField("locked_resource") else None)
    return max(
        ((used[d] + locked[d]) / top[d] for d in _DIMS if top[d] > 0),
        default=0.0,
    )


def _counts(names: Iterable[str]) -> str:
    counted = Counter(names)
    return ", ".join(f"{n} {s}" for s, n in sorted(counted.items())) or "none"


def fmt_liveness(info: Any) -> str:
    """What the liveness judge does now (GetClusterInfo's `liveness`): SUSPENDED during
    a suspected disruption, a grace window after the RM could not hear, else judging."""
    judge = info.liveness
    if judge.disrupted:
        return (
            f"SUSPENDED since {fmt_time(judge.disrupted_since)}: {judge.silent_agents} of "
            f"{judge.agents} agents silent at once, a suspected disruption (the RM or its "
            "network): nothing is declared LOST (docs/operations.md)"
        )
    grace_end = max(
        judge.agents_judged_from.ToDatetime(), judge.engine_conns_judged_from.ToDatetime()
    )
    if info.HasField("time") and grace_end > info.time.ToDatetime():
        return (
            f"grace window until {grace_end:%Y-%m-%dT%H:%M:%SZ} "
            f"({judge.heard_since_reason}): nothing is declared LOST before then"
        )
    return (
        f"judging; silence counts since {fmt_time(judge.heard_since)} ({judge.heard_since_reason})"
    )


def cmd_status(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl status`."""
    info = client.get_cluster_info()
    ecms = list(client.list_ecms())
    live = [
        ec
        for st in sorted(LIVE_EC_STATES)
        for ec in client.list_engine_conns(state=ec_state_name(st).lower())
    ]
    records = list(client.list_label_resources())
    demands = list(client.list_demands())
    if print_json(out, args.output, info):
        return 0
    # The totals are the capacity of the nodes that are there: a LOST node's is not.
    lost = {e.instance for e in ecms if e.state == resource_manager_pb2.ECM_STATE_LOST}
    nodes = [r for r in records if r.source == "ecm" and _instance_of(r) not in lost]
    cordoned = sum(1 for e in ecms if e.cordoned)
    replicas = "; ".join(
        f"{r.replica_id} on {r.host} (pid {r.pid}, up {fmt_age(r.start_time)}"
        f"{', runs ' + ', '.join(r.leases) if r.leases else ''})"
        for r in info.replicas
    )
    demand_states = (demand_pb2.DemandState.Name(d.state).removeprefix("DEMAND_STATE_")
                     for d in demands)  # fmt: skip
    print_details(
        out,
        [
            ("rm", f"{client.target} version {info.version} (rmctl {VERSION})"),
            ("replicas", f"{len(info.replicas)}: {replicas or '-'}"),
            ("database", info.database),
            ("liveness", fmt_liveness(info)),
            (
                "nodes",
                f"{len(ecms)}: {_counts(ecm_state_name(e.state) for e in ecms)}"
                + (f" ({cordoned} cordoned)" if cordoned else ""),
            ),
            ("engineconns", f"{len(live)} live: {_counts(ec_state_name(e.state) for e in live)}"),
            (
                "total",
                fmt_dims(_sum(r.max_resource for r in nodes))
                + (f" (without {len(lost)} LOST)" if lost else ""),
            ),
            ("used", fmt_dims(_sum(r.used_resource for r in nodes))),
            ("locked", fmt_dims(_sum(r.locked_resource for r in nodes))),
            ("left", fmt_dims(_sum(r.left_resource for r in nodes))),
            ("waiting_applies", str(info.waiting_applies)),
            ("demands", f"{len(demands)}: {_counts(demand_states)}"),
        ],
    )
    loaded = sorted(records, key=load_of, reverse=True)[: args.top]
    if loaded:
        print("\nmost loaded labels:", file=out)
        _print_labels(loaded, out)
    return 0


def _instance_of(record: Any) -> str:
    """The ECM instance of an ECM's label record ("emInstance=host:port")."""
    return next((lb.value for lb in labels_from(record.label) if lb.key == "emInstance"), "")


def _print_labels(records: list[Any], out: TextIO) -> None:
    print_table(
        out,
        ("label", "load", "used", "locked", "left", "tickets"),
        (
            (
                r.label,
                f"{load_of(r) * 100:.0f}%",
                fmt_dims(dims(r.used_resource)),
                fmt_dims(dims(r.locked_resource)),
                fmt_dims(dims(r.left_resource)),
                str(r.live_tickets),
            )
            for r in records
        ),
    )


def _ticket_user(t: Any) -> str:
    """The ticket's user, else the user part of its userCreator label (as the RM counts)."""
    if t.user:
        return str(t.user)
    creator = next((lb.value for lb in t.labels if lb.key == "userCreator"), "")
    return creator.split("-", 1)[0] or "-"


def cmd_top(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl top [--by user|label]`."""
    if args.by == "label":
        records = sorted(client.list_label_resources(), key=load_of, reverse=True)
        _print_labels(records, out)
        return 0
    per_user: dict[str, dict[str, int]] = {}
    tickets: Counter[str] = Counter()
    for t in client.list_tickets():
        held = t.used_resource if t.HasField("used_resource") else t.requested_resource
        user = _ticket_user(t)
        total = per_user.setdefault(user, dict.fromkeys(_DIMS, 0))
        for d, v in dims(held).items():
            total[d] += v
        tickets[user] += 1
    ranked = sorted(per_user.items(), key=lambda kv: (-kv[1]["memory_bytes"], kv[0]))
    print_table(
        out,
        ("user", "memory", "cpu", "instances", "tickets"),
        (
            (
                user,
                format_bytes(d["memory_bytes"]),
                format_cpu(d["cpu_millis"]),
                str(d["instances"]),
                str(tickets[user]),
            )
            for user, d in ranked
        ),
    )
    return 0


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
        _mismatch_table(out, report.mismatches)
        print(f"inconsistent: {len(report.mismatches)} mismatches", file=sys.stderr)
    if report.over_limit and args.output != "json":
        # Expected after a limit was lowered below what is in use: a note, not a failure.
        _mismatch_table(out, report.over_limit, ("label", "field", "in use", "maximum", "detail"))
        print(
            f"note: {len(report.over_limit)} labels over their limit after a change"
            " (nothing more is granted there; they drain as tickets end)",
            file=sys.stderr,
        )
    return 0 if report.consistent else 1


def _mismatch_table(
    out: TextIO,
    rows: Any,
    header: tuple[str, ...] = ("label", "field", "stored", "expected", "detail"),
) -> None:
    print_table(
        out,
        header,
        (
            (
                m.label,
                m.field,
                fmt_resource(opt(m, "stored")),
                fmt_resource(opt(m, "expected")),
                m.detail or "-",
            )
            for m in rows
        ),
    )
