"""Domain objects -> JSON for the console (the console's one conversion module, as
service/convert.py is the gRPC API's). Times are ISO 8601 in UTC; resources are
``{"kind": ..., "dims": {dimension: quantity}}``. Every string of an answer goes out
through `shown`: text others wrote (reasons, an EngineConn's report, a program's log
tail) has its control characters written out, as rmctl shows them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from labelrm_common.text import visible
from rm_server.domain.demands.model import Demand
from rm_server.domain.demands.timelang import Span, order_ids
from rm_server.domain.demands.waits import wait_text
from rm_server.domain.engineconn import EcmStatus, EngineConn
from rm_server.domain.external import ProviderConfig
from rm_server.domain.labels import ENGINE_TYPE, Label, LabelError, LabelKey
from rm_server.domain.limits import LabelPattern, LimitRule, best_limit
from rm_server.domain.model import ConsistencyReport, LabelResource, StoredLimit, Ticket
from rm_server.domain.resources import Resource, ResourceError, headroom

Json = dict[str, Any]


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


def left_of(r: LabelResource) -> Resource | None:
    """What is left under the maximum (None without one, or when it does not compute)."""
    if r.max_resource is None:
        return None
    try:
        return headroom(r.max_resource, r.used, r.locked, r.protected)
    except ResourceError:
        return None


def label_resource(r: LabelResource) -> Json:
    return {
        "label": r.label,
        "source": r.source,
        "max": resource(r.max_resource),
        "protected": resource(r.protected),
        "used": resource(r.used),
        "locked": resource(r.locked),
        "reserved": resource(r.reserved),
        "left": resource(left_of(r)),
        "live_tickets": r.live_tickets,
        "updated_at": at(r.updated_at),
    }


def node(s: EcmStatus, record: LabelResource | None) -> Json:
    return {
        "instance": s.instance,
        "state": s.state.value,
        "labels": labels(s.labels),
        "total": resource(s.total),
        "protected": resource(s.protected),
        "used": resource(record.used) if record else None,
        "locked": resource(record.locked) if record else None,
        "left": resource(s.left),
        "registered_at": at(s.registered_at),
        "updated_at": at(s.updated_at),
        "last_heartbeat_at": at(s.last_heartbeat_at),
        "live_engine_conns": s.live_engine_conns,
        "draining": s.state.value == "DRAINING",
        "isolation": s.isolation.to_dict() if s.isolation is not None else None,
    }


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
        "hold_expires_at": at(ec.hold_expires_at),
        "created_at": at(ec.created_at),
        "updated_at": at(ec.updated_at),
        "ready_at": at(ec.ready_at),
        "ended_at": at(ec.ended_at),
        "reason": ec.reason,
    }
    if full:  # never the secret
        out.update(
            address=ec.address,
            pid=ec.pid,
            exit_code=ec.exit_code,
            log_tail=ec.log_tail,
            launch_attempts=ec.launch_attempts,
            params=dict(ec.params),
            ecm_choices=[
                {
                    "node": c.instance,
                    "eligible": c.eligible,
                    "score": c.score,
                    "reasons": list(c.reasons),
                }
                for c in ec.ecm_choices
            ],
        )
    return out


def ticket(t: Ticket) -> Json:
    return {
        "id": t.ticket_id,
        "state": t.state.value,
        "user": t.user,
        "labels": labels(t.labels),
        "charged_labels": list(t.charged_labels),
        "requested": resource(t.requested),
        "locked": resource(t.locked),
        "used": resource(t.used),
        "created_at": at(t.created_at),
        "updated_at": at(t.updated_at),
        "lock_expires_at": at(t.lock_expires_at),
        "engine_conn_id": t.engine_conn_id,
    }


def demand(d: Demand) -> Json:
    v = d.view()
    return {
        "id": d.demand_id,
        "user": d.user,
        "state": d.state.value,
        "reason": d.reason,
        "labels": labels(d.labels),
        "charged_labels": list(d.charged_labels),
        "resource": resource(d.resource),
        "submitted_at": at(d.submitted_at),
        "planned_start": at(d.planned_start),
        "plan_start": at(d.plan_start),
        "plan_end": at(d.plan_end),
        "window": [at(w) for w in _window(v.window)],
        "duration_s": v.hold.duration.total_seconds() if v.hold.duration else None,
        "deadline": at(v.hold.deadline),
        "order_by": list(order_ids(v.order)),
        "waiting": wait_text(d.order_wait),
        "allocated_at": at(d.allocated_at),
        "claimed_at": at(d.claimed_at),
        "ended_at": at(d.ended_at),
        "closed_at": at(d.closed_at),
        "ticket_id": d.ticket_id or "",
        "events": [
            {
                "from": e.from_state.value if e.from_state else None,
                "to": e.to_state.value,
                "at": at(e.at),
                "reason": e.reason,
            }
            for e in d.events
        ],
    }


def _window(w: Any) -> tuple[datetime | None, datetime | None]:
    """A plain window's bounds; a composite one (chances, unions) shows as unbounded."""
    if isinstance(w, Span):
        return (w.lo, w.hi)
    return (None, None)


def limit(lim: StoredLimit) -> Json:
    return {
        "pattern": lim.pattern,
        "max": resource(lim.max_resource),
        "updated_at": at(lim.updated_at),
    }


def consistency(r: ConsistencyReport) -> Json:
    return {
        "labels_checked": r.labels_checked,
        "tickets_checked": r.tickets_checked,
        "mismatches": [
            {"label": m.label, "field": m.field, "detail": m.detail} for m in r.mismatches
        ],
    }


def winning_limit(label: str, limits: Sequence[StoredLimit]) -> str:
    """The pattern of the limit that applies to `label` (the most specific match, as
    admission picks it), "" when none does."""
    try:
        key = LabelKey.parse(label)
    except LabelError:
        return ""
    rules = [LimitRule(LabelPattern.parse(lim.pattern), lim.max_resource) for lim in limits]
    best = best_limit(key, rules)
    return str(best.pattern) if best is not None else ""


def engine_type(t: Ticket) -> str:
    return next((lb.value for lb in t.labels if lb.key == ENGINE_TYPE), "(none)")


def totals_by(tickets: Iterable[Ticket], key: Callable[[Ticket], str]) -> dict[str, Json]:
    """Locked and used per group of live tickets, summed per dimension (kinds may
    differ between tickets: dimensions are added by name)."""
    out: dict[str, Json] = {}
    for t in tickets:
        group = out.setdefault(key(t), {"tickets": 0, "locked": {}, "used": {}})
        group["tickets"] += 1
        for field, r in (("locked", t.locked), ("used", t.used)):
            for dim, n in (r.as_dict() if r is not None else {}).items():
                group[field][dim] = group[field].get(dim, 0) + n
    return out


def provider(c: ProviderConfig) -> Json:
    """An external provider, without its credentials."""
    return {
        "name": c.name,
        "type": c.type.value,
        "cluster": c.cluster,
        "addresses": list(c.addresses),
        "auth": c.auth.value,
    }
