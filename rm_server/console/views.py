"""Domain objects -> JSON for the console (the console's one conversion module, as
service/convert.py is the gRPC API's). Times are ISO 8601 in UTC; resources are
``{"kind": ..., "dims": {dimension: quantity}}``. Every string of an answer goes out
through `shown`: text others wrote (reasons, an EngineConn's report, a program's log
tail) has its control characters written out, as rmctl shows them.

A list row comes with the text it shows (`Row`): the list filter matches that text, and
only that text (ids, users, states, labels, nodes, reasons): never a field the page does
not show, nor a JSON key."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from labelrm_common.text import visible
from rm_server.app.listings import GroupTotal, Series
from rm_server.domain.demands.model import Demand
from rm_server.domain.demands.timelang import Span, order_ids
from rm_server.domain.demands.waits import wait_text
from rm_server.domain.engineconn import EcmStatus, EngineConn
from rm_server.domain.external import ProviderConfig
from rm_server.domain.labels import Label, LabelError, LabelKey
from rm_server.domain.limits import LabelPattern, LimitRule, best_limit
from rm_server.domain.model import ConsistencyReport, LabelResource, StoredLimit, Ticket
from rm_server.domain.resources import CPU, MEMORY, Resource
from rm_server.domain.usage import US_PER_SECOND, UsageGroup, efficiency

Json = dict[str, Any]
GiB = 1024**3
Event = tuple[datetime, str, str]


class Row(NamedTuple):
    """A list row and the text it shows (lower case), which the filter searches."""

    json: Json
    text: str


def _text(*parts: Any) -> str:
    """The words a row shows, as the page shows them (`shown`), in lower case."""
    return str(shown(" ".join(str(p) for p in parts if p not in (None, "")))).lower()


def _label_text(items: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in items.items())


def shown(value: Any) -> Any:
    """`value` (JSON data) with the control characters of every string, keys included,
    written out (``\\x1b``, ``\\u202e``; labelrm_common/text.py); line breaks and tabs
    stay (a page shows them as spaces, a log tail in <pre> as what they are). A page
    must not be made to show what it does not say (bidirectional overrides)."""
    if isinstance(value, str):
        return visible(value, keep="\n\t")
    if isinstance(value, dict):
        return {shown(k): shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shown(v) for v in value]
    return value


def at(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def resource(r: Resource | None) -> Json | None:
    if r is None:
        return None
    out: Json = {"kind": r.kind.value, "dims": r.as_dict()}
    if r.queue:
        out["queue"] = r.queue
    return out


def labels(items: Iterable[Label]) -> dict[str, str]:
    return {lb.key: lb.value for lb in items}


def events(rows: Sequence[Event]) -> list[Json]:
    """Recorded states, newest first: (time, state, reason)."""
    return [{"at": at(t), "state": s, "reason": r} for t, s, r in reversed(rows)]


# ----- labels and nodes ----------------------------------------------------------------------


def label_resource(r: LabelResource) -> Json:
    return {
        "id": r.label,
        "label": r.label,
        "source": r.source,
        "max": resource(r.max_resource),
        "protected": resource(r.protected),
        "used": resource(r.used),
        "locked": resource(r.locked),
        "reserved": resource(r.reserved),
        "left": resource(r.left()),  # the API's left_resource: reservations held back
        "live_tickets": r.live_tickets,
        "updated_at": at(r.updated_at),
    }


def label_row(r: LabelResource, limit: str) -> Row:
    """A label record as the resources list shows it: with the limit that applies to it
    and its load (what it is sorted by "use")."""
    out = label_resource(r)
    out["limit"] = limit
    out["load"] = load(r)
    return Row(out, _text(r.label, r.source, limit))


def node(s: EcmStatus, record: LabelResource | None) -> Json:
    return {
        "id": s.instance,
        "instance": s.instance,
        "state": s.state.value,
        "labels": labels(s.labels),
        "total": resource(s.total),
        "protected": resource(s.protected),
        "used": resource(record.used) if record else None,
        "locked": resource(record.locked) if record else None,
        "reserved": resource(record.reserved) if record else None,
        "left": resource(s.left),  # GetEcm's left_resource
        "registered_at": at(s.registered_at),
        "updated_at": at(s.updated_at),
        "last_heartbeat_at": at(s.last_heartbeat_at),
        "live_engine_conns": s.live_engine_conns,
        "draining": s.state.value == "DRAINING",
        "cordoned": s.cordoned,  # CordonEcm: no new work, what runs goes on
        "cordon_reason": s.cordon_reason,
        "isolation": s.isolation.to_dict() if s.isolation is not None else None,
    }


def node_row(s: EcmStatus, record: LabelResource | None) -> Row:
    out = node(s, record)
    cordon = "cordoned " + s.cordon_reason if s.cordoned else ""
    return Row(out, _text(s.instance, s.state.value, _label_text(out["labels"]), cordon))


# ----- EngineConns, tickets, demands ---------------------------------------------------------


def engine_conn(ec: EngineConn, full: bool = False) -> Json:
    out: Json = {
        "id": ec.ec_id,
        "state": ec.state.value,
        "user": ec.user,
        "engine": ec.engine,
        "labels": labels(ec.labels),
        "resource": resource(ec.resource),
        "granted": resource(ec.granted),
        "measured": ec.measured.to_dict() if ec.measured is not None else None,
        "measured_at": at(ec.measured_at),
        "node": ec.ecm_instance,
        "ticket_id": ec.ticket_id,
        "holder": ec.holder,
        "created_at": at(ec.created_at),
        "ended_at": at(ec.ended_at),
        "reason": ec.reason,
    }
    if full:  # never the secret
        out.update(
            hold_expires_at=at(ec.hold_expires_at),
            updated_at=at(ec.updated_at),
            ready_at=at(ec.ready_at),
            address=ec.address,
            pid=ec.pid,
            exit_code=ec.exit_code,
            log_tail=ec.log_tail,
            work_dir=ec.work_dir,
            launch_attempts=ec.launch_attempts,
            params=dict(ec.params),
            ecm_choices=[
                {
                    "id": c.instance,
                    "node": c.instance,
                    "eligible": c.eligible,
                    "score": c.score,
                    "reasons": list(c.reasons),
                }
                for c in ec.ecm_choices
            ],
        )
    return out


def engine_conn_row(ec: EngineConn) -> Row:
    out = engine_conn(ec)
    words = (ec.ec_id, ec.user, ec.engine, ec.state.value, ec.ecm_instance, ec.holder, ec.reason)
    return Row(out, _text(*words))


def ticket(t: Ticket, full: bool = False) -> Json:
    out: Json = {
        "id": t.ticket_id,
        "state": t.state.value,
        "user": t.user,
        "labels": labels(t.labels),
        "locked": resource(t.locked),
        "used": resource(t.used),
        "created_at": at(t.created_at),
        "engine_conn_id": t.engine_conn_id,
    }
    if full:
        out.update(
            charged_labels=list(t.charged_labels),
            requested=resource(t.requested),
            updated_at=at(t.updated_at),
            lock_expires_at=at(t.lock_expires_at),
            ended_at=at(t.ended_at),
            end_reason=t.end_reason,
        )
    return out


def ticket_row(t: Ticket) -> Row:
    out = ticket(t)
    return Row(out, _text(t.ticket_id, t.user, t.state.value, _label_text(out["labels"]),
                          t.engine_conn_id))  # fmt: skip


def demand_key(user: str, demand_id: str) -> str:
    """A demand's id in the console: its user and its id (demand ids are per user)."""
    return f"{user}/{demand_id}"


def demand(d: Demand, full: bool = False) -> Json:
    v = d.view()
    out: Json = {
        "id": demand_key(d.user, d.demand_id),
        "demand_id": d.demand_id,
        "user": d.user,
        "state": d.state.value,
        "reason": d.reason,
        "labels": labels(d.labels),
        "charged_labels": list(d.charged_labels),
        "resource": resource(d.resource),
        "submitted_at": at(d.submitted_at),
        # The start the plan expects (GetDemand's planned_start_time); the plan holds
        # capacity from plan_start (one lead time earlier: the reservation) to plan_end.
        "planned_start": at(d.planned_start),
        "plan_start": at(d.plan_start),
        "plan_end": at(d.plan_end),
        "window": [at(w) for w in _window(v.window)],
        "duration_s": v.hold.duration.total_seconds() if v.hold.duration else None,
        "deadline": at(v.hold.deadline),
        # OrderBy names demands of the same user: their console ids.
        "order_by": [demand_key(d.user, i) for i in order_ids(v.order)],
        "waiting": wait_text(d.order_wait),
        "allocated_at": at(d.allocated_at),
        "ended_at": at(d.ended_at),
        "ticket_id": d.ticket_id or "",
    }
    if full:
        out.update(
            claimed_at=at(d.claimed_at),
            closed_at=at(d.closed_at),
            claim_expires_at=at(d.claim_expires_at),
            reserved_labels=list(d.reserved_labels),
            events=[
                {
                    "from": e.from_state.value if e.from_state else None,
                    "to": e.to_state.value,
                    "at": at(e.at),
                    "reason": e.reason,
                }
                for e in reversed(d.events)  # newest first
            ],
        )
    return out


def demand_row(d: Demand) -> Row:
    out = demand(d)
    return Row(out, _text(d.demand_id, d.user, d.state.value, out["waiting"] or d.reason,
                          _label_text(out["labels"])))  # fmt: skip


def _window(w: Any) -> tuple[datetime | None, datetime | None]:
    """A plain window's bounds; a composite one (chances, unions) shows as unbounded."""
    if isinstance(w, Span):
        return (w.lo, w.hi)
    return (None, None)


# ----- limits, providers, aggregates ---------------------------------------------------------


def limit(lim: StoredLimit) -> Json:
    return {
        "id": lim.pattern,
        "pattern": lim.pattern,
        "max": resource(lim.max_resource),
        "updated_at": at(lim.updated_at),
    }


def consistency(r: ConsistencyReport, checked_at: datetime) -> Json:
    return {
        "labels_checked": r.labels_checked,
        "tickets_checked": r.tickets_checked,
        "mismatches": [
            {"label": m.label, "field": m.field, "detail": m.detail} for m in r.mismatches
        ],
        "checked_at": at(checked_at),
    }


def limit_rules(limits: Sequence[StoredLimit]) -> list[LimitRule]:
    """The stored limits as admission matches them (parsed once for a whole list)."""
    return [LimitRule(LabelPattern.parse(lim.pattern), lim.max_resource) for lim in limits]


def winning_limit(label: str, rules: Sequence[LimitRule]) -> str:
    """The pattern of the limit that applies to `label` (the most specific match, as
    admission picks it), "" when none does."""
    try:
        key = LabelKey.parse(label)
    except LabelError:
        return ""
    best = best_limit(key, rules)
    return str(best.pattern) if best is not None else ""


def totals(groups: Mapping[str, GroupTotal], count: int) -> Json:
    """Live tickets summed per group, the largest groups first, and how many groups
    there are in all (more than shown: the rest are smaller)."""
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1].tickets, kv[0]))
    return {
        "groups": [
            {"id": g, "tickets": t.tickets, "locked": t.locked, "used": t.used} for g, t in ordered
        ],
        "count": count,
    }


def provider(c: ProviderConfig) -> Json:
    """An external provider, without its credentials."""
    return {
        "id": c.name,
        "name": c.name,
        "type": c.type.value,
        "cluster": c.cluster,
        "addresses": list(c.addresses),
        "auth": c.auth.value,
    }


def cluster_totals(records: Iterable[LabelResource]) -> dict[str, Json]:
    """The cluster, per dimension: the sums of every ECM's record (max, used, locked,
    reserved, protected, and left as ListLabelResources' left_resource has it)."""
    out: dict[str, Json] = {}
    fields = ("max", "used", "locked", "reserved", "protected", "left")
    for r in records:
        parts = (r.max_resource, r.used, r.locked, r.reserved, r.protected, r.left())
        for field, part in zip(fields, parts, strict=True):
            for dim, n in (part.as_dict() if part is not None else {}).items():
                out.setdefault(dim, dict.fromkeys(fields, 0))[field] += n
    return out


def load(r: LabelResource) -> float:
    """The largest share of its maximum that any dimension of a label holds (used,
    locked or reserved); 0 without a maximum."""
    if r.max_resource is None:
        return 0.0
    held = [r.used, r.locked] + ([r.reserved] if r.reserved is not None else [])
    shares = [
        sum(h.as_dict().get(d, 0) for h in held) / m
        for d, m in r.max_resource.as_dict().items()
        if m
    ]
    return max(shares, default=0.0)


def usage(series: Series, since: datetime, step_seconds: float) -> Json:
    """A label's held resources over time: samples ``since + i * step``."""
    return {"since": at(since), "step_s": step_seconds, "dims": series}


def usage_group(g: UsageGroup) -> Json:
    """One group of the usage ledger in the page's units: GiB-hours and core-hours
    granted and measured, efficiencies (None: nothing measured), counts."""
    a = g.amounts
    hours = 3600 * US_PER_SECOND
    return {
        "key": g.key,
        "tickets": a["tickets"],
        "memory_gib_h": g.granted.get(MEMORY, 0) / GiB / hours,
        "cpu_core_h": g.granted.get(CPU, 0) / 1000 / hours,
        "measured_memory_gib_h": a["measured_memory"] / GiB / hours,
        "measured_cpu_core_h": a["measured_cpu"] / hours,
        "memory_efficiency": efficiency(a["measured_memory"], a["measured_granted_memory"]),
        "cpu_efficiency": efficiency(a["measured_cpu"] * 1000, a["measured_granted_cpu"]),
        "engine_conns": a["engine_conns"],
        "demands_failed": a["demands_failed"],
    }
