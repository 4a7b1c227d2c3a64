"""Rows to domain objects and back. Resources are stored as Resource.to_dict()."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from rm_server.domain.labels import Label
from rm_server.domain.model import Ticket, TicketState
from rm_server.domain.resources import Resource


def res(value: Any) -> Resource:
    return Resource.from_dict(value)


def opt_res(value: Any) -> Resource | None:
    return None if value is None else Resource.from_dict(value)


def jres(resource: Resource | None) -> Jsonb | None:
    return None if resource is None else Jsonb(resource.to_dict())


def jlabels(labels: tuple[Label, ...]) -> Jsonb:
    return Jsonb([[label.key, label.value] for label in labels])


def labels_of(value: Any) -> tuple[Label, ...]:
    return tuple(Label(str(k), str(v)) for k, v in value)


TICKET_COLUMNS = (
    "ticket_id, state, user_name, labels, charged_labels, requested, locked, used,"
    " created_at, updated_at, lock_expires_at"
)


def ticket_from_row(row: tuple[Any, ...]) -> Ticket:
    (
        ticket_id,
        state,
        user,
        labels,
        charged,
        requested,
        locked,
        used,
        created,
        updated,
        expires,
    ) = row
    state_enum = TicketState(state)
    return Ticket(
        ticket_id=ticket_id,
        state=state_enum,
        user=user,
        labels=labels_of(labels),
        charged_labels=tuple(charged),
        requested=res(requested),
        locked=res(locked),
        used=res(used) if state_enum is TicketState.USED else None,
        created_at=created,
        updated_at=updated,
        lock_expires_at=expires,
    )


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
