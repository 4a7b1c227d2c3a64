"""Request builders shared by the async client and its generated blocking twin.

Everything the two clients have in common that does not touch the network lives here:
label parsing, state names, request ids and every request message. A client method is then
one builder call, one `_call`, and the field it returns.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeAlias

from google.protobuf.timestamp_pb2 import Timestamp
from labelrm.v1 import admin_pb2, demand_pb2, resource_manager_pb2, resource_pb2, usage_pb2

from labelrm_common.durations import duration

DEFAULT_TARGET = "127.0.0.1:7100"

LabelsLike: TypeAlias = "Sequence[resource_pb2.Label] | Mapping[str, str] | str"
"""Labels as messages, a {key: value} dict, or "k=v,k2=v2" text."""

StateLike: TypeAlias = "int | str | None"

_STATES = {
    "locked": resource_manager_pb2.TICKET_STATE_LOCKED,
    "used": resource_manager_pb2.TICKET_STATE_USED,
    "released": resource_manager_pb2.TICKET_STATE_RELEASED,
    "expired": resource_manager_pb2.TICKET_STATE_EXPIRED,
}

DEMAND_STATES: dict[str, int] = {
    name.removeprefix("DEMAND_STATE_").lower(): int(value)
    for name, value in demand_pb2.DemandState.items()
    if value != demand_pb2.DEMAND_STATE_UNSPECIFIED
}
"""Demand state names as rmctl and the SDK accept them ("new", "allocated", ...)."""


def parse_labels(text: str) -> list[resource_pb2.Label]:
    """Parse "k=v,k2=v2" (each item split at its first '='); ValueError when malformed."""
    out: list[resource_pb2.Label] = []
    text = text.strip()
    if not text:
        return out
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label {item.strip()!r} is not of the form key=value")
        out.append(resource_pb2.Label(key=key.strip(), value=value.strip()))
    return out


def to_labels(labels: LabelsLike) -> list[resource_pb2.Label]:
    """Normalise any accepted labels form to a list of resource_pb2.Label."""
    if isinstance(labels, str):
        return parse_labels(labels)
    if isinstance(labels, Mapping):
        return [resource_pb2.Label(key=str(k), value=str(v)) for k, v in labels.items()]
    out: list[resource_pb2.Label] = []
    for item in labels:
        if not isinstance(item, resource_pb2.Label):
            raise TypeError(f"expected resource_pb2.Label, got {type(item).__name__}")
        out.append(item)
    return out


def labels_text(labels: LabelsLike) -> str:
    """The "k=v,k2=v2" text of labels (the server canonicalises it)."""
    if isinstance(labels, str):
        return labels.strip()
    return ",".join(f"{lb.key}={lb.value}" for lb in to_labels(labels))


def ticket_state(state: StateLike) -> int:
    """A TicketState enum value from an int, "locked"/"LOCKED"/"TICKET_STATE_LOCKED" or None."""
    if state is None:
        return int(resource_manager_pb2.TICKET_STATE_UNSPECIFIED)
    if isinstance(state, int):
        return state
    name = state.strip().lower().removeprefix("ticket_state_")
    if name not in _STATES:
        raise ValueError(f"unknown ticket state {state!r}: expected one of {sorted(_STATES)}")
    return int(_STATES[name])


def demand_state(state: StateLike) -> int:
    """A DemandState value from an int, "allocated" / "DEMAND_STATE_ALLOCATED" or None."""
    if state is None:
        return int(demand_pb2.DEMAND_STATE_UNSPECIFIED)
    if isinstance(state, int):
        return state
    name = state.strip().lower().removeprefix("demand_state_")
    if name not in DEMAND_STATES:
        raise ValueError(f"unknown demand state {state!r}: expected one of {sorted(DEMAND_STATES)}")
    return DEMAND_STATES[name]


def request_id(given: str | None) -> str:
    """The caller's request id, or a fresh uuid4 that the call's retries reuse."""
    return given if given else str(uuid.uuid4())


# --- ResourceManagerService ---------------------------------------------------------------------


def register_ecm(
    instance: str, total: Any, protected: Any, labels: LabelsLike, rid: str | None
) -> resource_manager_pb2.RegisterEcmRequest:
    """RegisterEcmRequest."""
    return resource_manager_pb2.RegisterEcmRequest(
        request_id=request_id(rid),
        instance=instance,
        labels=to_labels(labels),
        total_resource=total,
        protected_resource=protected,
    )


def unregister_ecm(instance: str, rid: str | None) -> resource_manager_pb2.UnregisterEcmRequest:
    """UnregisterEcmRequest."""
    return resource_manager_pb2.UnregisterEcmRequest(request_id=request_id(rid), instance=instance)


def apply(
    labels: LabelsLike, resource: Any, wait_timeout: float, user: str, rid: str | None
) -> resource_manager_pb2.ApplyRequest:
    """ApplyRequest; ValueError for a negative wait_timeout (0: do not wait)."""
    if wait_timeout < 0:
        raise ValueError("wait_timeout must not be negative")
    return resource_manager_pb2.ApplyRequest(
        request_id=request_id(rid),
        labels=to_labels(labels),
        resource=resource,
        wait_timeout=duration(wait_timeout) if wait_timeout > 0 else None,
        user=user,
    )


def report_used(
    ticket_id: str, used: Any, rid: str | None
) -> resource_manager_pb2.ReportUsedRequest:
    """ReportUsedRequest (all of the ticket when `used` is None)."""
    return resource_manager_pb2.ReportUsedRequest(
        request_id=request_id(rid), ticket_id=ticket_id, used_resource=used
    )


def release(ticket_id: str, rid: str | None) -> resource_manager_pb2.ReleaseRequest:
    """ReleaseRequest."""
    return resource_manager_pb2.ReleaseRequest(request_id=request_id(rid), ticket_id=ticket_id)


def list_tickets(
    label: LabelsLike, state: StateLike, page_size: int
) -> resource_manager_pb2.ListTicketsRequest:
    """ListTicketsRequest (first page)."""
    return resource_manager_pb2.ListTicketsRequest(
        page_size=page_size, label=labels_text(label), state=ticket_state(state)
    )


# --- AdminService -------------------------------------------------------------------------------


def set_label_limit(
    labels: LabelsLike, max_resource: Any, rid: str | None
) -> admin_pb2.SetLabelLimitRequest:
    """SetLabelLimitRequest."""
    return admin_pb2.SetLabelLimitRequest(
        request_id=request_id(rid), labels=to_labels(labels), max_resource=max_resource
    )


def delete_label_limit(labels: LabelsLike, rid: str | None) -> admin_pb2.DeleteLabelLimitRequest:
    """DeleteLabelLimitRequest."""
    return admin_pb2.DeleteLabelLimitRequest(request_id=request_id(rid), labels=to_labels(labels))


def refresh_nodes(
    include: Iterable[str], exclude: Iterable[str], rid: str | None
) -> admin_pb2.RefreshNodesRequest:
    """RefreshNodesRequest."""
    return admin_pb2.RefreshNodesRequest(
        request_id=request_id(rid), include=list(include), exclude=list(exclude)
    )


# --- DemandService ------------------------------------------------------------------------------


def submit_demand(
    demand_id: str, labels: LabelsLike, resource: Any, when: str, user: str
) -> demand_pb2.SubmitDemandRequest:
    """SubmitDemandRequest; the time conditions only when `when` is not blank (the server
    applies its defaults otherwise). The demand id is the idempotency key."""
    req = demand_pb2.SubmitDemandRequest(
        demand_id=demand_id, user=user, labels=to_labels(labels), resource=resource
    )
    if when.strip():
        req.time_conditions_text = when
    return req


def cancel_demand(
    demand_id: str, reason: str, user: str, rid: str | None
) -> demand_pb2.CancelDemandRequest:
    """CancelDemandRequest."""
    return demand_pb2.CancelDemandRequest(
        request_id=request_id(rid), demand_id=demand_id, reason=reason, user=user
    )


def claim_demand(demand_id: str, user: str, rid: str | None) -> demand_pb2.ClaimDemandRequest:
    """ClaimDemandRequest."""
    return demand_pb2.ClaimDemandRequest(request_id=request_id(rid), demand_id=demand_id, user=user)


USAGE_GROUPINGS = {
    "user": usage_pb2.USAGE_GROUPING_USER,
    "label": usage_pb2.USAGE_GROUPING_LABEL,
    "engine_type": usage_pb2.USAGE_GROUPING_ENGINE_TYPE,
    "user_creator": usage_pb2.USAGE_GROUPING_USER_CREATOR,
    "hour": usage_pb2.USAGE_GROUPING_HOUR,
}


def _timestamp(when: datetime | None) -> Timestamp | None:
    if when is None:
        return None
    out = Timestamp()
    out.FromDatetime(when)
    return out


def get_usage(
    group_by: str, since: datetime | None, until: datetime | None, user: str, page_size: int
) -> usage_pb2.GetUsageRequest:
    """A GetUsageRequest; ValueError naming the grouping when it is not one of
    USAGE_GROUPINGS."""
    grouping = USAGE_GROUPINGS.get(group_by.replace("-", "_"))
    if grouping is None:
        raise ValueError(f"group_by must be one of {', '.join(USAGE_GROUPINGS)}, got {group_by!r}")
    return usage_pb2.GetUsageRequest(
        since=_timestamp(since),
        until=_timestamp(until),
        group_by=grouping,
        user=user,
        page_size=page_size,
    )
