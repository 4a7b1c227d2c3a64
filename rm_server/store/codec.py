"""Rows to domain objects and back. Resources are stored as Resource.to_dict()."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb

from rm_server.domain.labels import Label
from rm_server.domain.ledger import LabelAccount, Waiter
from rm_server.domain.model import Ticket, TicketState
from rm_server.domain.resources import Resource

# Resources read back from rows, by their stored items: a list page decodes four or five
# per row, mostly the same few (the sizes engines ask for, zero), and a Resource is
# immutable. Bounded: emptied when full.
_RESOURCES: dict[tuple[tuple[str, Any], ...], Resource] = {}
MAX_RESOURCES_SEEN = 4096


def res(value: Any) -> Resource:
    """A stored resource (Resource.to_dict's form), decoded once per process."""
    try:
        key = tuple(value.items())
        found = _RESOURCES.get(key)
    except (AttributeError, TypeError):  # not a mapping, or a nested one (special kinds)
        key, found = (), None
    if not key:
        return Resource.from_dict(value)
    if found is None:
        found = Resource.from_dict(value)
        # To a dict, True and 1.0 are the key 1: they would find the resource of a 1,
        # which from_dict refuses. Stored resources hold neither; the cache must not
        # change that: only ints and texts are kept.
        if all(type(v) is int or type(v) is str for _, v in key):
            if len(_RESOURCES) >= MAX_RESOURCES_SEEN:
                _RESOURCES.clear()
            _RESOURCES[key] = found
    return found


def opt_res(value: Any) -> Resource | None:
    return None if value is None else res(value)


def jres(resource: Resource | None) -> Jsonb | None:
    return None if resource is None else Jsonb(resource.to_dict())


def jlabels(labels: tuple[Label, ...]) -> Jsonb:
    return Jsonb([[label.key, label.value] for label in labels])


def labels_of(value: Any) -> tuple[Label, ...]:
    return tuple(Label(str(k), str(v)) for k, v in value)


def at(value: Any) -> datetime:
    """A timestamptz as psycopg gives it, or as PostgreSQL writes it in JSON."""
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value).astimezone(UTC)


def _opt_at(value: Any) -> datetime | None:
    return None if value is None else at(value)


def _json_time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


_LABELS: dict[tuple[str, str], Label] = {}


def _label(key: str, value: str) -> Label:
    """Labels read back from tickets, validated once per process (a bounded cache)."""
    label = _LABELS.get((key, value))
    if label is None:
        if len(_LABELS) >= 65536:
            _LABELS.clear()
        label = _LABELS[(key, value)] = Label(key, value)
    return label


def _labels_json(labels: tuple[Label, ...]) -> list[list[str]]:
    return [[label.key, label.value] for label in labels]


# ----- label_resource ------------------------------------------------------------------------

# What a LabelAccount reads of a label_resource row.
LABEL_COLUMNS = (
    "r.label, r.source, r.max_resource, r.protected, r.used, r.locked, r.live_tickets,"
    " r.reserved"  # demands' reserved capacity (migration 0003)
)
LABEL_NAMES = tuple(c.strip().removeprefix("r.") for c in LABEL_COLUMNS.split(","))


# The state of the ECM a record belongs to (none for other records), read with it; a
# cordoned RUNNING ECM reads CORDONED: it takes no new work either.
ECM_STATE = (
    "(SELECT CASE WHEN e.cordoned AND e.state = 'RUNNING' THEN 'CORDONED' ELSE e.state END"
    " FROM ecm e WHERE e.label = r.label) AS ecm_state"
)


def account_from_row(record: Sequence[Any], ecm_state: str | None = None) -> LabelAccount:
    """A LabelAccount from the first columns of a record selected with LABEL_COLUMNS
    (or the same values read from JSON), with its ECM's state if read (ECM_STATE)."""
    label, source, maximum, protected, used, locked, live, reserved = record[:8]
    return LabelAccount(
        label,
        source,
        opt_res(maximum),
        res(protected),
        res(used),
        res(locked),
        live,
        opt_res(reserved),
        ecm_state,
    )


def accounts_json(accounts: Sequence[LabelAccount]) -> str:
    """The changed accounts as one JSON text (WRITE_LABELS's document: far cheaper to
    send from Python than five arrays)."""
    return json.dumps(
        [
            {
                "label": a.label,
                "used": a.used.to_dict(),
                "locked": a.locked.to_dict(),
                "kind": a.locked.kind.value,
                "live": a.live_tickets,
            }
            for a in accounts
        ]
    )


# ----- ticket (live) -------------------------------------------------------------------------

TICKET_COLUMNS = (
    "ticket_id, state, user_name, labels, charged_labels, requested, locked, used,"
    " created_at, updated_at, lock_expires_at, engine_conn_id"
)
TICKET_NAMES = tuple(c.strip() for c in TICKET_COLUMNS.split(","))


def ticket_from_row(row: Sequence[Any]) -> Ticket:
    """A live ticket from a record selected with TICKET_COLUMNS."""
    return ticket_from_json(dict(zip(TICKET_NAMES, row, strict=True)))


def ticket_from_json(obj: dict[str, Any]) -> Ticket:
    """A live ticket from its row as a mapping of TICKET_COLUMNS (read as JSON or not)."""
    state = TicketState(obj["state"])
    return Ticket(
        ticket_id=obj["ticket_id"],
        state=state,
        user=obj["user_name"],
        labels=tuple(_label(str(k), str(v)) for k, v in obj["labels"]),
        charged_labels=tuple(obj["charged_labels"]),
        requested=res(obj["requested"]),
        locked=res(obj["locked"]),
        used=res(obj["used"]) if state is TicketState.USED else None,
        created_at=at(obj["created_at"]),
        updated_at=at(obj["updated_at"]),
        lock_expires_at=_opt_at(obj["lock_expires_at"]),
        engine_conn_id=obj.get("engine_conn_id") or "",
    )


def ticket_json(t: Ticket) -> dict[str, Any]:
    """A live ticket as a row of TICKET_COLUMNS, in JSON."""
    used = t.used if t.used is not None else Resource.zero(t.requested.kind, t.requested.queue)
    return {
        "ticket_id": t.ticket_id,
        "state": t.state.value,
        "user_name": t.user,
        "labels": _labels_json(t.labels),
        "charged_labels": list(t.charged_labels),
        "requested": t.requested.to_dict(),
        "locked": t.locked.to_dict(),
        "used": used.to_dict(),
        "created_at": _json_time(t.created_at),
        "updated_at": _json_time(t.updated_at),
        "lock_expires_at": _json_time(t.lock_expires_at),
        "engine_conn_id": t.engine_conn_id or None,
    }


# ----- ticket_history (ended tickets) --------------------------------------------------------

HISTORY_COLUMNS = (
    "ticket_id, final_state, reason, user_name, labels, charged_labels, requested, used,"
    " created_at, reported_at, ended_at"
)


def ticket_from_history(row: tuple[Any, ...]) -> Ticket:
    (ticket_id, state, reason, user, labels, charged, requested, used, created, reported, ended) = (
        row
    )
    requested_res = res(requested)
    ended_at: datetime = ended
    return Ticket(
        ticket_id=ticket_id,
        state=TicketState(state),
        user=user,
        labels=labels_of(labels),
        charged_labels=tuple(charged),
        requested=requested_res,
        locked=Resource.zero(requested_res.kind, requested_res.queue),
        used=opt_res(used),
        created_at=created,
        updated_at=reported or created,
        ended_at=ended_at,
        end_reason=reason,
    )


def history_json(live: Ticket, ended: Ticket) -> dict[str, Any]:
    """An ended ticket as a row of HISTORY_COLUMNS, in JSON (`live`: as it was before)."""
    return {
        "ticket_id": live.ticket_id,
        "final_state": ended.state.value,
        "reason": ended.end_reason,
        "user_name": live.user,
        "labels": _labels_json(live.labels),
        "charged_labels": list(live.charged_labels),
        "requested": live.requested.to_dict(),
        "used": None if live.used is None else live.used.to_dict(),
        "created_at": _json_time(live.created_at),
        "reported_at": _json_time(live.updated_at if live.used is not None else None),
        "ended_at": _json_time(ended.ended_at),
    }


# ----- apply_waiter (as READ in store/tickets.py aggregates it) ------------------------------


def waiter_from_json(item: list[Any]) -> Waiter:
    """A waiter as [seq, user_name, resource, hold_until]."""
    seq, user, resource, hold_until = item
    return Waiter(int(seq), user, opt_res(resource), _opt_at(hold_until))
