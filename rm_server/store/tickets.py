"""Apply, ReportUsed, Release and lock expiry: each runs inside one transaction
given by `Database.run*`, locking label rows sorted by label text first, then the
ticket row."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from rm_server.domain.admission import label_shortfalls
from rm_server.domain.external import QueueCheck
from rm_server.domain.labels import Label, LabelKey
from rm_server.domain.limits import LabelPattern, LimitRule, best_limit
from rm_server.domain.model import Refusal, Ticket, TicketState
from rm_server.domain.resources import Resource, ResourceError, Shortfall
from rm_server.errors import FailedPrecondition, InvalidArgument, NotFound
from rm_server.store.codec import (
    HISTORY_COLUMNS,
    TICKET_COLUMNS,
    jlabels,
    jres,
    opt_res,
    res,
    ticket_from_history,
    ticket_from_row,
)
from rm_server.store.db import Conn
from rm_server.store.notify import notify_freed

NO_WAITER = 2**63 - 1  # a new request ranks after every registered waiter


@dataclass(frozen=True)
class LabelRow:
    """A label_resource row as locked by the current transaction."""

    label: str
    source: str
    max_resource: Resource | None
    protected: Resource
    used: Resource
    locked: Resource
    live_tickets: int
    queued: bool  # an earlier waiter is queued on this label
    # Held for ALLOCATING time-aware demands (migration 0003, rm_server/store/demands.py):
    # counted as in use by check_rows. None when nothing is reserved.
    reserved: Resource | None = None


class NeedLimitRows(Exception):
    """Labels without a record have a configured limit: create their rows, then retry."""

    def __init__(self, labels: Sequence[str]) -> None:
        super().__init__(", ".join(labels))
        self.labels = tuple(labels)


class MustWait(Exception):
    """An Apply that may wait did not fit: roll back and wait for a release."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__("must wait")
        self.refusal = refusal


@dataclass(frozen=True)
class ApplyCommand:
    ticket_id: str
    user: str
    labels: tuple[Label, ...]
    keys: tuple[str, ...]  # resource-carrying labels, canonical (sorted) order
    resource: Resource
    now: datetime
    lock_expires_at: datetime
    waiter_seq: int | None = None
    may_wait: bool = False
    # A YARN queue the request must also fit (its record is one of `keys`).
    external: QueueCheck | None = None


# What LabelRow reads of a label_resource row (`queued` is computed by each query).
LABEL_COLUMNS = (
    "r.label, r.source, r.max_resource, r.protected, r.used, r.locked, r.live_tickets,"
    " r.reserved"  # demands' reserved capacity (migration 0003)
)


def label_row(record: Sequence[Any], queued: bool) -> LabelRow:
    """A LabelRow from the first columns of a record selected with LABEL_COLUMNS."""
    label, source, maximum, protected, used, locked, live, reserved = record[:8]
    return LabelRow(
        label,
        source,
        opt_res(maximum),
        res(protected),
        res(used),
        res(locked),
        live,
        queued,
        opt_res(reserved),
    )


async def lock_labels(
    conn: Conn, labels: Sequence[str], now: datetime, waiter_seq: int = NO_WAITER
) -> dict[str, LabelRow]:
    """Lock the rows of `labels` in canonical order; flag labels with an earlier waiter."""
    cur = await conn.execute(
        f"SELECT {LABEL_COLUMNS},"  # noqa: S608 - constant column list
        " EXISTS (SELECT 1 FROM apply_waiter w WHERE w.label = r.label AND w.seq < %s"
        "         AND w.expires_at > %s)"
        " FROM label_resource r WHERE r.label = ANY(%s) ORDER BY r.label FOR UPDATE OF r",
        (waiter_seq, now, list(labels)),
    )
    return {record[0]: label_row(record, record[8]) for record in await cur.fetchall()}


WRITE_LABELS = (
    "UPDATE label_resource r SET used = u.used, locked = u.locked, kind = u.kind,"
    " live_tickets = u.live, updated_at = %s"
    " FROM json_to_recordset(%s::json)"
    "   AS u(label text, used jsonb, locked jsonb, kind text, live bigint)"
    " WHERE r.label = u.label"
)


async def write_labels(conn: Conn, rows: Sequence[LabelRow], now: datetime) -> None:
    """Write back used, locked and live ticket counts of locked rows in one statement."""
    if not rows:
        return
    await conn.execute(WRITE_LABELS, (now, labels_json(rows)))


def labels_json(rows: Sequence[LabelRow]) -> str:
    """WRITE_LABELS's document: one JSON text rather than five arrays (far cheaper to
    send from Python)."""
    return json.dumps(
        [
            {
                "label": r.label,
                "used": r.used.to_dict(),
                "locked": r.locked.to_dict(),
                "kind": r.locked.kind.value,
                "live": r.live_tickets,
            }
            for r in rows
        ]
    )


async def load_limit_rules(conn: Conn, key_names: Sequence[str]) -> list[LimitRule]:
    cur = await conn.execute(
        "SELECT pattern, max_resource FROM label_limit WHERE key_names = ANY(%s)",
        (list(key_names),),
    )
    return [LimitRule(LabelPattern.parse(p), res(m)) for p, m in await cur.fetchall()]


def key_names(label: str) -> str:
    return ",".join(LabelKey.parse(label).keys())


async def _labels_needing_rows(conn: Conn, missing: Sequence[str]) -> list[str]:
    rules = await load_limit_rules(conn, sorted({key_names(m) for m in missing}))
    return [m for m in missing if best_limit(LabelKey.parse(m), rules) is not None]


def _charge(row: LabelRow, resource: Resource) -> LabelRow:
    try:
        return replace(row, locked=row.locked + resource, live_tickets=row.live_tickets + 1)
    except ResourceError as exc:
        raise InvalidArgument("resource", f"does not match label {row.label}: {exc}") from exc


def check_rows(rows: Sequence[LabelRow], resource: Resource) -> Refusal | None:
    """Every shortfall over the rows with a maximum, or the labels queued behind waiters."""
    shortfalls: list[Shortfall] = []
    for row in rows:
        if row.max_resource is None:
            continue
        try:
            # Capacity reserved for demands in their window is not handed to others: it
            # counts like protected capacity. A demand's own allocation hands its
            # reservation over first, in the same transaction (store/demands.py).
            held = row.protected if row.reserved is None else row.protected + row.reserved
            shortfalls.extend(
                label_shortfalls(row.label, row.max_resource, row.used, row.locked, held, resource)
            )
        except ResourceError as exc:
            raise InvalidArgument("resource", f"does not match label {row.label}: {exc}") from exc
    queued = tuple(row.label for row in rows if row.queued)
    if shortfalls or queued:
        return Refusal(tuple(shortfalls), queued)
    return None


def decide_apply(
    cmd: ApplyCommand, rows: Mapping[str, LabelRow]
) -> tuple[list[LabelRow], Ticket] | Refusal:
    """Check every locked row, then charge all or none (in memory): the charged rows and
    the new ticket, or the refusal (MustWait when the command may wait). Labels without
    a row must already be known to need none."""
    ordered = [rows[k] for k in cmd.keys if k in rows]
    charged = [_charge(row, cmd.resource) for row in ordered]  # validates kinds first
    refusal = check_rows(ordered, cmd.resource)
    if cmd.external is not None:
        queue = rows.get(cmd.external.label)
        if queue is None:  # created in the Apply's transaction (store/providers.py)
            raise FailedPrecondition(f"no record of queue {cmd.external.label}")
        outside = cmd.external.refusal(queue.locked, cmd.resource)
        if outside is not None and refusal is not None:
            outside = replace(outside, shortfalls=refusal.shortfalls + outside.shortfalls)
            outside = replace(outside, queued_behind=refusal.queued_behind)
        refusal = outside or refusal
    if refusal is not None:
        if cmd.may_wait:
            raise MustWait(refusal)
        return refusal
    ticket = Ticket(
        ticket_id=cmd.ticket_id,
        state=TicketState.LOCKED,
        user=cmd.user,
        labels=cmd.labels,
        charged_labels=tuple(r.label for r in ordered),
        requested=cmd.resource,
        locked=cmd.resource,
        used=None,
        created_at=cmd.now,
        updated_at=cmd.now,
        lock_expires_at=cmd.lock_expires_at,
    )
    return charged, ticket


async def apply(conn: Conn, cmd: ApplyCommand) -> Ticket | Refusal:
    """Lock every label, check every one, then charge all or none."""
    seq = NO_WAITER if cmd.waiter_seq is None else cmd.waiter_seq
    rows = await lock_labels(conn, cmd.keys, cmd.now, seq)
    missing = [k for k in cmd.keys if k not in rows]
    if missing:
        need = await _labels_needing_rows(conn, missing)
        if need:
            raise NeedLimitRows(need)
    outcome = decide_apply(cmd, rows)
    if isinstance(outcome, Refusal):
        return outcome
    charged, ticket = outcome
    await write_labels(conn, charged, cmd.now)
    await conn.execute(
        f"INSERT INTO ticket ({TICKET_COLUMNS}) VALUES"  # noqa: S608 - constant column list
        " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            ticket.ticket_id,
            ticket.state.value,
            ticket.user,
            jlabels(ticket.labels),
            list(ticket.charged_labels),
            jres(ticket.requested),
            jres(ticket.locked),
            jres(Resource.zero(cmd.resource.kind, cmd.resource.queue)),
            ticket.created_at,
            ticket.updated_at,
            ticket.lock_expires_at,
        ),
    )
    if cmd.waiter_seq is not None:
        await conn.execute("DELETE FROM apply_waiter WHERE seq = %s", (cmd.waiter_seq,))
    return ticket


async def register_waiter(
    conn: Conn, waiter_id: str, labels: Sequence[str], expires_at: datetime
) -> int:
    """Queue a waiting apply on each of its labels; returns its global sequence number."""
    cur = await conn.execute("SELECT nextval('apply_waiter_seq')")
    row = await cur.fetchone()
    assert row is not None
    seq = int(row[0])
    await conn.execute(
        "INSERT INTO apply_waiter (label, seq, waiter_id, expires_at)"
        " SELECT unnest(%s::text[]), %s, %s, %s",
        (list(labels), seq, waiter_id, expires_at),
    )
    return seq


async def remove_waiter(conn: Conn, seq: int) -> None:
    """Leave the queue; waiters behind it may now go, so wake them."""
    cur = await conn.execute("DELETE FROM apply_waiter WHERE seq = %s RETURNING label", (seq,))
    await notify_freed(conn, [r[0] for r in await cur.fetchall()])


async def purge_waiters(conn: Conn, now: datetime) -> int:
    """Drop waiters whose deadline passed (their replica may have died)."""
    cur = await conn.execute(
        "DELETE FROM apply_waiter WHERE expires_at <= %s RETURNING label", (now,)
    )
    labels = [r[0] for r in await cur.fetchall()]
    await notify_freed(conn, labels)
    return len(labels)


async def _read_ticket(conn: Conn, ticket_id: str, *, lock: bool) -> Ticket | None:
    sql = f"SELECT {TICKET_COLUMNS} FROM ticket WHERE ticket_id = %s"  # noqa: S608
    cur = await conn.execute(sql + (" FOR UPDATE" if lock else ""), (ticket_id,))
    row = await cur.fetchone()
    return None if row is None else ticket_from_row(row)


async def read_history(conn: Conn, ticket_id: str) -> Ticket | None:
    cur = await conn.execute(
        f"SELECT {HISTORY_COLUMNS} FROM ticket_history WHERE ticket_id = %s",  # noqa: S608
        (ticket_id,),
    )
    row = await cur.fetchone()
    return None if row is None else ticket_from_history(row)


async def get_ticket(conn: Conn, ticket_id: str) -> Ticket:
    ticket = await _read_ticket(conn, ticket_id, lock=False)
    if ticket is None:
        ticket = await read_history(conn, ticket_id)
    if ticket is None:
        raise NotFound(f"ticket {ticket_id} not found")
    return ticket


async def _lock_live_ticket(
    conn: Conn, ticket_id: str, now: datetime
) -> tuple[Ticket | None, dict[str, LabelRow]]:
    """Lock a live ticket's labels (canonical order) and then the ticket itself.

    Charged labels never change, so reading them before taking the locks is safe.
    Returns (None, {}) when the ticket is not live (ended, or never existed).
    """
    peek = await _read_ticket(conn, ticket_id, lock=False)
    if peek is None:
        return None, {}
    rows = await lock_labels(conn, peek.charged_labels, now)
    ticket = await _read_ticket(conn, ticket_id, lock=True)
    return ticket, rows


async def end_ticket(
    conn: Conn,
    ticket: Ticket,
    rows: dict[str, LabelRow],
    now: datetime,
    final_state: TicketState,
    reason: str,
) -> Ticket:
    """Return a live ticket's resource to its labels and move it to the history."""
    updated, ended = decide_end(ticket, rows, now, final_state, reason)
    await write_labels(conn, updated, now)
    await conn.execute("DELETE FROM ticket WHERE ticket_id = %s", (ticket.ticket_id,))
    await conn.execute(
        f"INSERT INTO ticket_history ({HISTORY_COLUMNS}) VALUES"  # noqa: S608
        " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            ticket.ticket_id,
            final_state.value,
            reason,
            ticket.user,
            jlabels(ticket.labels),
            list(ticket.charged_labels),
            jres(ticket.requested),
            jres(ticket.used),
            ticket.created_at,
            ticket.updated_at if ticket.used is not None else None,
            now,
        ),
    )
    await notify_freed(conn, [r.label for r in updated])
    return ended


def decide_end(
    ticket: Ticket,
    rows: Mapping[str, LabelRow],
    now: datetime,
    final_state: TicketState,
    reason: str,
) -> tuple[list[LabelRow], Ticket]:
    """A live ticket's resource returned to its locked rows (in memory): the updated
    rows and the ended ticket."""
    updated = []
    for label in ticket.charged_labels:
        row = rows.get(label)
        if row is None:  # the label's record was removed (ECM unregistered)
            continue
        used = row.used - ticket.used if ticket.used is not None else row.used
        updated.append(
            replace(
                row, used=used, locked=row.locked - ticket.locked, live_tickets=row.live_tickets - 1
            )
        )
    ended = replace(
        ticket,
        state=final_state,
        locked=Resource.zero(ticket.locked.kind, ticket.locked.queue),
        ended_at=now,
        end_reason=reason,
        lock_expires_at=None,
    )
    return updated, ended


async def _not_live(conn: Conn, ticket_id: str) -> FailedPrecondition | NotFound:
    return not_live_error(ticket_id, await read_history(conn, ticket_id))


def not_live_error(ticket_id: str, ended: Ticket | None) -> FailedPrecondition | NotFound:
    """Why a ticket that is not live cannot be reported: ended (`ended`), or unknown."""
    if ended is None:
        return NotFound(f"ticket {ticket_id} not found")
    return FailedPrecondition(
        f"ticket {ticket_id} is {ended.state.value} ({ended.end_reason})",
        state=ended.state.value,
        reason="TICKET_ENDED",
    )


async def report_used(conn: Conn, ticket_id: str, used: Resource | None, now: datetime) -> Ticket:
    """LOCKED -> USED: the locked resource moves to used; any unused part is freed."""
    ticket, rows = await _lock_live_ticket(conn, ticket_id, now)
    if ticket is None:
        raise await _not_live(conn, ticket_id)
    if lock_expired(ticket, now):
        await end_ticket(conn, ticket, rows, now, TicketState.EXPIRED, "lock timeout")
        raise lock_expired_error(ticket_id)
    updated, reported, freed = decide_report(ticket, rows, used, now)
    await write_labels(conn, updated, now)
    await conn.execute(
        "UPDATE ticket SET state = 'USED', used = %s, locked = %s, lock_expires_at = NULL,"
        " updated_at = %s WHERE ticket_id = %s",
        (jres(reported.used), jres(reported.locked), now, ticket_id),
    )
    if freed:
        await notify_freed(conn, [r.label for r in updated])
    return reported


def lock_expired(ticket: Ticket, now: datetime) -> bool:
    """A LOCKED ticket past its lock timeout: ReportUsed expires it (and fails)."""
    return (
        ticket.state is TicketState.LOCKED
        and ticket.lock_expires_at is not None
        and now >= ticket.lock_expires_at
    )


def lock_expired_error(ticket_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"ticket {ticket_id} was not reported within the lock timeout",
        state="EXPIRED",
        reason="LOCK_EXPIRED",
    )


def decide_report(
    ticket: Ticket, rows: Mapping[str, LabelRow], used: Resource | None, now: datetime
) -> tuple[list[LabelRow], Ticket, bool]:
    """LOCKED -> USED in memory (the lock is not expired): the updated rows, the USED
    ticket, and whether part of the lock was freed."""
    ticket_id = ticket.ticket_id
    if ticket.state is not TicketState.LOCKED:
        raise FailedPrecondition(
            f"ticket {ticket_id} is {ticket.state.value}, not LOCKED",
            state=ticket.state.value,
            reason="TICKET_NOT_LOCKED",
        )
    actual = ticket.locked if used is None else used
    try:
        within = ticket.locked.ge(actual)
        remainder = ticket.locked - actual if within else None
    except ResourceError as exc:
        raise InvalidArgument("used_resource", str(exc)) from exc
    if remainder is None:
        raise FailedPrecondition(
            f"used_resource exceeds what ticket {ticket_id} locked",
            state="LOCKED",
            reason="USED_EXCEEDS_LOCKED",
        )
    updated = [
        replace(row, locked=row.locked - ticket.locked, used=row.used + actual)
        for label in ticket.charged_labels
        if (row := rows.get(label)) is not None
    ]
    zero = Resource.zero(ticket.locked.kind, ticket.locked.queue)
    reported = replace(
        ticket,
        state=TicketState.USED,
        used=actual,
        locked=zero,
        updated_at=now,
        lock_expires_at=None,
    )
    return updated, reported, not remainder.is_zero()


async def release(conn: Conn, ticket_id: str, now: datetime, reason: str = "released") -> Ticket:
    """End a live ticket; an ended one is returned as it is (Release is idempotent)."""
    ticket, rows = await _lock_live_ticket(conn, ticket_id, now)
    if ticket is None:
        ended = await read_history(conn, ticket_id)
        if ended is None:
            raise NotFound(f"ticket {ticket_id} not found")
        return ended
    return await end_ticket(conn, ticket, rows, now, TicketState.RELEASED, reason)


async def expired_ticket_ids(conn: Conn, now: datetime, limit: int) -> list[str]:
    cur = await conn.execute(
        "SELECT ticket_id FROM ticket WHERE state = 'LOCKED' AND lock_expires_at <= %s"
        " ORDER BY lock_expires_at LIMIT %s",
        (now, limit),
    )
    return [r[0] for r in await cur.fetchall()]


async def expire_ticket(conn: Conn, ticket_id: str, now: datetime) -> bool:
    """Reclaim one LOCKED ticket past its lock timeout; False if it no longer qualifies."""
    ticket, rows = await _lock_live_ticket(conn, ticket_id, now)
    if (
        ticket is None
        or ticket.state is not TicketState.LOCKED
        or ticket.lock_expires_at is None
        or ticket.lock_expires_at > now
    ):
        return False
    await end_ticket(conn, ticket, rows, now, TicketState.EXPIRED, "lock timeout")
    return True


async def list_tickets(conn: Conn, after: str, limit: int, label: str, state: str) -> list[Ticket]:
    cur = await conn.execute(
        f"SELECT {TICKET_COLUMNS} FROM ticket WHERE ticket_id > %s"  # noqa: S608
        " AND (%s = '' OR charged_labels @> ARRAY[%s]::text[])"
        " AND (%s = '' OR state = %s)"
        " ORDER BY ticket_id LIMIT %s",
        (after, label, label, state, state, limit),
    )
    return [ticket_from_row(r) for r in await cur.fetchall()]
