"""Demands in SQL: rows, transitions and the plan's inputs (their reservations and the
hand-over to a ticket: rm_server/store/demand_reservations.py).

Lock order, in every transaction that touches a demand (docs/architecture.md, "Lock
order"): the demand row first, then the plan's advisory locks of its labels
(``lock_plan``), then the limits' lock when label rows are created, then the label rows
(canonical order, through ``tickets.lock_labels``), then the ticket row. This extends the
order of the Apply path (labels, then ticket), so the two never deadlock. Admission
serialises on the plan's advisory locks per label instead of label row locks, so
planning never blocks an ordinary Apply; a planner round takes them before any label row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg

from rm_server.domain.demands import codec
from rm_server.domain.demands.model import Demand
from rm_server.domain.demands.planner import (
    LabelCapacity,
    PlanEntry,
    PlannerSettings,
    TicketStatus,
)
from rm_server.domain.demands.state import DemandState, Transition, step
from rm_server.domain.demands.timelang import order_ids
from rm_server.domain.demands.waits import Predecessor
from rm_server.domain.labels import LabelKey
from rm_server.domain.limits import best_limit
from rm_server.domain.resources import Resource
from rm_server.errors import InvalidArgument
from rm_server.store import ticket_reads
from rm_server.store import tickets as ticket_store
from rm_server.store.codec import (
    jlabels,
    jres,
    labels_of,
    res,
)
from rm_server.store.db import Conn, page_filters

ACTIVE = [s.value for s in DemandState if s.active]
# Advisory lock namespaces (the second key of pg_advisory_xact_lock(int, int)).
PLAN_LOCK = 0x6C72_6D03  # per label: admission and re-planning on that label
ORDER_LOCK = 0x6C72_6D04  # OrderBy graph: cycle checks see every committed edge

COLUMNS = (
    "demand_id, state, reason, user_name, labels, charged_labels, resource, conditions,"
    " submitted_at, planned_start, plan_start, plan_end, slip_seconds, rounds, closed_at,"
    " reserved_labels, ticket_id, allocated_at, claim_expires_at, claimed_at, ended_at,"
    " overruns, next_check_at, updated_at, definition_hash, parked_at"
)
# Columns a use case may change besides the state (never the definition).
_MUTABLE = frozenset(
    {
        "planned_start",
        "plan_start",
        "plan_end",
        "rounds",
        "closed_at",
        "reserved_labels",
        "ticket_id",
        "allocated_at",
        "claim_expires_at",
        "claimed_at",
        "ended_at",
        "overruns",
        "next_check_at",
        "parked_at",
    }
)


def from_row(row: Sequence[Any], events: tuple[Transition, ...] = ()) -> Demand:
    (
        demand_id,
        state,
        reason,
        user,
        labels,
        charged,
        resource,
        conditions,
        submitted,
        planned,
        plan_start,
        plan_end,
        slip,
        rounds,
        closed,
        reserved,
        ticket_id,
        allocated,
        claim_expires,
        claimed,
        ended,
        overruns,
        next_check,
        updated,
        digest,
        parked_at,
    ) = row
    return Demand(
        demand_id=demand_id,
        state=DemandState(state),
        reason=reason,
        user=user,
        labels=labels_of(labels),
        charged_labels=tuple(charged),
        resource=res(resource),
        conditions=codec.from_json(conditions),
        submitted_at=submitted,
        planned_start=planned,
        plan_start=plan_start,
        plan_end=plan_end,
        slip=timedelta(seconds=slip),
        rounds=rounds,
        closed_at=closed,
        reserved_labels=tuple(reserved),
        ticket_id=ticket_id,
        allocated_at=allocated,
        claim_expires_at=claim_expires,
        claimed_at=claimed,
        ended_at=ended,
        overruns=tuple(overruns),
        next_check_at=next_check,
        updated_at=updated,
        definition_hash=bytes(digest),
        events=events,
        parked_at=parked_at,
    )


def is_transient(exc: BaseException) -> bool:
    """A database error (retried by ``Database.run``), as opposed to a bug in a round."""
    return isinstance(exc, psycopg.Error)


# ----- reading ---------------------------------------------------------------------------------


async def events_of(conn: Conn, user: str, demand_id: str) -> tuple[Transition, ...]:
    cur = await conn.execute(
        "SELECT from_state, to_state, at, reason FROM demand_event"
        " WHERE user_name = %s AND demand_id = %s ORDER BY id",
        (user, demand_id),
    )
    return tuple(
        Transition(DemandState(f) if f else None, DemandState(t), at, reason)
        for f, t, at, reason in await cur.fetchall()
    )


async def get(
    conn: Conn, user: str | None, demand_id: str, *, lock: bool = False, with_events: bool = False
) -> Demand | None:
    """`user`'s demand `demand_id`. `user` None (an operator naming no user): the one
    demand of that id, whoever's; InvalidArgument when several users have one."""
    sql = f"SELECT {COLUMNS} FROM demand WHERE demand_id = %s"  # noqa: S608 - constant columns
    if user is not None:
        sql += " AND user_name = %s"
    cur = await conn.execute(
        sql + " LIMIT 2" + (" FOR UPDATE" if lock else ""),
        (demand_id,) if user is None else (demand_id, user),
    )
    rows = await cur.fetchall()
    if not rows:
        return None
    if len(rows) > 1:
        raise InvalidArgument("user", f"several users have a demand {demand_id}: name the user")
    d = from_row(rows[0])
    return replace(d, events=await events_of(conn, d.user, demand_id)) if with_events else d


async def list_demands(
    conn: Conn, after: tuple[str, str], limit: int, state: str, user: str
) -> list[Demand]:
    """A page in (user, demand id) order, after the (user, demand id) `after`."""
    where, values = page_filters(("state = %s", state), ("user_name = %s", user))
    cur = await conn.execute(
        f"SELECT {COLUMNS} FROM demand WHERE (user_name, demand_id) > (%s, %s)"  # noqa: S608
        f" AND {where} ORDER BY user_name, demand_id LIMIT %s",
        (*after, *values, limit),
    )
    return [from_row(r) for r in await cur.fetchall()]


async def due_keys(conn: Conn, due: datetime, limit: int) -> list[tuple[str, str]]:
    """The (user, demand id) pairs of at most ``limit`` demands due by ``due``, earliest
    first: read, not locked (each round then claims its own, ``claim_due``)."""
    cur = await conn.execute(
        "SELECT user_name, demand_id FROM demand WHERE next_check_at <= %s"
        " ORDER BY next_check_at LIMIT %s",
        (due, limit),
    )
    return [(user, demand_id) for user, demand_id in await cur.fetchall()]


async def claim_due(conn: Conn, key: tuple[str, str], due: datetime) -> Demand | None:
    """Lock the demand ``key`` for a planner round if it is still due by ``due``; None
    when it is not, or another replica's round or a cancel holds it (skipped)."""
    cur = await conn.execute(
        f"SELECT {COLUMNS} FROM demand"  # noqa: S608
        " WHERE user_name = %s AND demand_id = %s AND next_check_at <= %s"
        " FOR UPDATE SKIP LOCKED",
        (*key, due),
    )
    row = await cur.fetchone()
    return None if row is None else from_row(row)


async def predecessors(
    conn: Conn, user: str, ids: Sequence[str], now: datetime, planner: PlannerSettings
) -> dict[str, Predecessor]:
    """The demands an OrderBy names, among `user`'s own (another user's demand of that id
    is not seen: for this user it is not submitted), each with its state and, while it
    is active, the end of its occupation of the plan as of `now`; an id not submitted has
    none (Predecessor.state None)."""
    found = await predecessors_of(conn, [(user, i) for i in ids], now, planner)
    return {i: found[(user, i)] for i in ids}


async def predecessors_of(
    conn: Conn, keys: Sequence[tuple[str, str]], now: datetime, planner: PlannerSettings
) -> dict[tuple[str, str], Predecessor]:
    """`predecessors` for many (user, demand id) pairs at once (a page of demands)."""
    out = {key: Predecessor(key[1], None) for key in keys}
    if not keys:
        return out
    cur = await conn.execute(
        f"SELECT user_name, demand_id, state, {_PLAN_END} FROM demand"  # noqa: S608
        " WHERE (user_name, demand_id) IN (SELECT * FROM unnest(%(users)s::text[],"
        " %(ids)s::text[]))",
        {
            "users": [u for u, _ in keys],
            "ids": [i for _, i in keys],
            **_occupation_params(now, planner),
        },
    )
    for user, demand_id, state, plan_end in await cur.fetchall():
        s = DemandState(state)
        out[(user, demand_id)] = Predecessor(demand_id, s, plan_end if s.active else None)
    return out


async def order_edges(conn: Conn, user: str, ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The OrderBy edges of `user`'s named demands (OrderBy names the user's own only)."""
    cur = await conn.execute(
        "SELECT demand_id, order_by_ids FROM demand WHERE user_name = %s AND demand_id = ANY(%s)",
        (user, list(ids)),
    )
    return {demand_id: tuple(edges) for demand_id, edges in await cur.fetchall()}


async def ticket_status(conn: Conn, ticket_id: str) -> TicketStatus:
    cur = await conn.execute("SELECT 1 FROM ticket WHERE ticket_id = %s", (ticket_id,))
    if await cur.fetchone() is not None:
        return TicketStatus(True)
    ended = await ticket_reads.read_history(conn, ticket_id)
    if ended is None:
        return TicketStatus(False, "UNKNOWN", "ticket not found")
    return TicketStatus(False, ended.state.value, ended.end_reason)


# ----- the plan ---------------------------------------------------------------------------------


async def lock_plan(conn: Conn, labels: Sequence[str]) -> None:
    """Serialise planning on these labels: one statement, the locks taken in the order of
    their keys (the canonical order, whatever the labels' hashes: two labels whose hashes
    collide share a lock, and an order by name could then take it twice over)."""
    if labels:
        await conn.execute(
            "SELECT count(pg_advisory_xact_lock(%s, k)) FROM"
            " (SELECT DISTINCT hashtext(l) AS k FROM unnest(%s::text[]) AS l ORDER BY k) AS s",
            (PLAN_LOCK, sorted(set(labels))),
        )


async def lock_order_graph(conn: Conn) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (ORDER_LOCK,))


# A demand's occupation of the plan from `since`: its stored one, or, parked, the one it
# has from then on (planner.occupation: from max(planned start, since), one lead time
# before, for its hold: its duration, else until its DeadLine while ahead, else the
# default). Used wherever a demand's occupation is read (the plan, its predecessors').
_START = "greatest(planned_start, %(since)s)"
_PLAN_START = f"CASE WHEN parked_at IS NULL THEN plan_start ELSE {_START} - %(lead)s END"
_PLAN_END = (
    "CASE WHEN parked_at IS NULL THEN plan_end"
    f" WHEN park_hold_seconds IS NOT NULL THEN {_START} + make_interval(secs => park_hold_seconds)"
    f" WHEN park_deadline > {_START} THEN park_deadline ELSE {_START} + %(default)s END"
)
# The plan on some labels, demands with the same labels, resource and times in one group
# (demands planned in the same round, or parked, share their times).
_OCCUPATION = f"""
SELECT charged_labels, resource, count(*), {_PLAN_START} AS plan_start, {_PLAN_END} AS plan_end
FROM demand
WHERE charged_labels && %(labels)s::text[] AND state = ANY(%(active)s)
AND NOT (user_name = %(user)s AND demand_id = %(demand_id)s)
GROUP BY charged_labels, resource, 4, 5
"""  # noqa: S608 - constant fragments


def _occupation_params(since: datetime, planner: PlannerSettings) -> dict[str, object]:
    return {"since": since, "lead": planner.lead_time, "default": planner.default_duration}


async def plan_entries(
    conn: Conn,
    labels: Sequence[str],
    since: datetime,
    leaving_out: tuple[str, str],
    planner: PlannerSettings,
) -> list[PlanEntry]:
    """The plan on any of ``labels`` from ``since``: the occupations of its active demands
    not ended by then, but for the demand ``leaving_out`` (user, demand id), grouped by
    labels, resource and times (a group's resource is their sum). Parked demands occupy
    it from ``since`` on (``_OCCUPATION``), so blocked ones share their times: a label
    with many blocked demands yields a handful of groups, not a row each."""
    cur = await conn.execute(
        f"SELECT * FROM ({_OCCUPATION}) o WHERE plan_end IS NULL OR plan_end > %(since)s",  # noqa: S608
        {
            "labels": list(labels),
            "active": ACTIVE,
            "user": leaving_out[0],
            "demand_id": leaving_out[1],
            **_occupation_params(since, planner),
        },
    )
    return [
        PlanEntry(tuple(charged), res(resource) * count, start, end)
        for charged, resource, count, start, end in await cur.fetchall()
    ]


async def capacities(conn: Conn, labels: Sequence[str]) -> dict[str, LabelCapacity]:
    """Each label's maximum and protected part: its record, else its configured limit."""
    cur = await conn.execute(
        "SELECT label, max_resource, protected FROM label_resource"
        " WHERE label = ANY(%s) AND max_resource IS NOT NULL",
        (list(labels),),
    )
    out = {
        label: LabelCapacity(label, res(maximum), res(protected))
        for label, maximum, protected in await cur.fetchall()
    }
    missing = [label for label in labels if label not in out]
    if missing:
        names = sorted({ticket_store.key_names(m) for m in missing})
        rules = await ticket_store.load_limit_rules(conn, names)
        for label in missing:
            rule = best_limit(LabelKey.parse(label), rules)
            if rule is not None:
                zero = Resource.zero(rule.max_resource.kind, rule.max_resource.queue)
                out[label] = LabelCapacity(label, rule.max_resource, zero)
    return out


# ----- writing ----------------------------------------------------------------------------------


async def _event(conn: Conn, d: Demand, t: Transition) -> None:
    await conn.execute(
        "INSERT INTO demand_event (user_name, demand_id, from_state, to_state, at, reason)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (
            d.user,
            d.demand_id,
            t.from_state.value if t.from_state else None,
            t.to_state.value,
            t.at,
            t.reason,
        ),
    )


async def insert(conn: Conn, d: Demand) -> bool:
    """Create a NEW demand with its first event; False if the id exists (a racing twin)."""
    named = list(order_ids(d.conditions.order_by))
    cur = await conn.execute(
        f"INSERT INTO demand ({COLUMNS}, order_by_ids) VALUES"  # noqa: S608
        " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
        "  %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (user_name, demand_id) DO NOTHING"
        " RETURNING 1",
        (
            d.demand_id,
            d.state.value,
            d.reason,
            d.user,
            jlabels(d.labels),
            list(d.charged_labels),
            jres(d.resource),
            json.dumps(codec.to_json(d.conditions)),
            d.submitted_at,
            d.planned_start,
            d.plan_start,
            d.plan_end,
            d.slip.total_seconds(),
            d.rounds,
            d.closed_at,
            list(d.reserved_labels),
            d.ticket_id,
            d.allocated_at,
            d.claim_expires_at,
            d.claimed_at,
            d.ended_at,
            list(d.overruns),
            d.next_check_at,
            d.updated_at,
            d.definition_hash,
            d.parked_at,
            named,
        ),
    )
    if await cur.fetchone() is None:
        return False
    await _event(conn, d, Transition(None, d.state, d.submitted_at, d.reason))
    return True


async def update(conn: Conn, d: Demand, now: datetime, **changes: Any) -> Demand:
    """Change mutable columns of a locked demand (no state change)."""
    unknown = set(changes) - _MUTABLE
    if unknown:
        raise ValueError(f"not mutable: {sorted(unknown)}")
    if not changes:
        return d
    names = sorted(changes)
    assignments = ", ".join(f"{n} = %s" for n in names)
    values = [_sql_value(changes[n]) for n in names]
    await conn.execute(
        f"UPDATE demand SET {assignments}, updated_at = %s"  # noqa: S608
        " WHERE user_name = %s AND demand_id = %s",
        (*values, now, d.user, d.demand_id),
    )
    return replace(d, updated_at=now, **changes)


def _sql_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


async def move(
    conn: Conn, d: Demand, target: DemandState, reason: str, now: datetime, **changes: Any
) -> Demand:
    """The one writer of ``demand.state``: a transition the table allows, persisted with
    its time and reason (compare-and-set on the current state)."""
    record = step(d.state, target, now, reason)
    d = await update(conn, d, now, **changes)
    cur = await conn.execute(
        "UPDATE demand SET state = %s, reason = %s"
        " WHERE user_name = %s AND demand_id = %s AND state = %s",
        (
            target.value,
            reason,
            d.user,
            d.demand_id,
            record.from_state.value if record.from_state else "",
        ),
    )
    if cur.rowcount != 1:  # pragma: no cover - the row is locked by this transaction
        raise RuntimeError(f"demand {d.demand_id} changed state under its lock")
    await _event(conn, d, record)
    return replace(d, state=target, reason=reason)


async def note(conn: Conn, d: Demand, reason: str, now: datetime) -> None:
    """Record something that is not a transition (from_state = to_state)."""
    await _event(conn, d, Transition(d.state, d.state, now, reason))
