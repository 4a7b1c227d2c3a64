"""The usage ledger (table usage_hour): the roll-up from the history, and the reports.

Roll-up: each source (ended tickets in ticket_history, EngineConns' ending events,
demands' transitions) is read from its watermark up to the horizon, the oldest
transaction id still running that could write to this database (HORIZON); what the
rows add (rm_server/domain/usage.py) is upserted into usage_hour and the watermark
moved past them, in one transaction under the watermark's row lock. A row is therefore
added once: never twice (the watermark moves with the addition, and a second replica's
pass waits for the lock, then starts where the first ended), never skipped (a
transaction below the horizon has ended: nothing it wrote can appear later), whatever
restarts in between (a pass that did not commit changed nothing).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from rm_server.domain.errors import DomainError
from rm_server.domain.usage import (
    DemandTransition,
    EndedEngineConn,
    EndedTicket,
    Ledger,
    UsageGroup,
    UsageKey,
    UsageQuery,
    demand_usage,
    engine_conn_usage,
    merge,
    names_of,
    ticket_usage,
)
from rm_server.store.codec import opt_res, res
from rm_server.store.db import Conn

log = logging.getLogger(__name__)

SOURCES = ("tickets", "engine_conns", "demands")

# The horizon: below it, every transaction that could have written to this database has
# ended. Transaction ids are the cluster's: a transaction still running in another
# database (seen in pg_stat_activity; a backend never changes database) holds nothing
# back here; one that cannot be placed (another role's session without the privilege
# to see it, a prepared transaction) does, to be safe.
HORIZON = (
    "WITH s AS (SELECT pg_current_snapshot() AS snap)"
    " SELECT least((SELECT pg_snapshot_xmax(snap)::text::bigint FROM s),"
    "  (SELECT min(x::text::bigint) FROM s, pg_snapshot_xip(s.snap) AS x"
    "   WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a"
    "     WHERE a.backend_xid::text::bigint = x::text::bigint % 4294967296"
    "     AND a.datname IS DISTINCT FROM current_database())))"
)
_TICKETS = (
    "SELECT xid, user_name, labels, charged_labels, requested, used, created_at,"
    " reported_at, ended_at, measured->>'cpu_time_micros', measured_memory"
    " FROM ticket_history WHERE xid >= %s AND xid < %s"
)
_ENGINE_CONNS = (
    "SELECT ev.xid, e.user_name, e.labels, e.created_at, coalesce(e.ended_at, ev.at), ev.state"
    " FROM engine_conn_event ev JOIN engine_conn e ON e.ec_id = ev.ec_id"
    " WHERE ev.state IN ('SUCCEEDED', 'FAILED', 'LOST') AND ev.xid >= %s AND ev.xid < %s"
)
_DEMANDS = (
    "SELECT ev.xid, ev.user_name, d.labels, ev.to_state, ev.at"
    " FROM demand_event ev JOIN demand d"
    "   ON d.user_name = ev.user_name AND d.demand_id = ev.demand_id"
    " WHERE ev.to_state IN ('ACCEPTED', 'ALLOCATED', 'FAILED')"
    " AND ev.from_state IS DISTINCT FROM ev.to_state AND ev.xid >= %s AND ev.xid < %s"
)
_READS = {"tickets": _TICKETS, "engine_conns": _ENGINE_CONNS, "demands": _DEMANDS}

_AMOUNT_COLUMNS = (
    "tickets", "measured_memory", "measured_cpu", "measured_granted_memory",
    "measured_granted_cpu", "engine_conns", "engine_conns_failed", "engine_conn_time",
    "demands_planned", "demands_allocated", "demands_failed",
)  # fmt: skip
_KEY_COLUMNS = ("hour", "user_name", "user_creator", "engine_type", "label")
_UPSERT = (
    "INSERT INTO usage_hour (hour, user_name, user_creator, engine_type, label, granted, "  # noqa: S608
    + ", ".join(_AMOUNT_COLUMNS)
    + ") SELECT hour, user_name, user_creator, engine_type, label, granted, "
    + ", ".join(_AMOUNT_COLUMNS)
    + " FROM json_to_recordset(%s::json) AS x(hour timestamptz, user_name text,"
    " user_creator text, engine_type text, label text, granted jsonb, "
    + ", ".join(f"{c} numeric" for c in _AMOUNT_COLUMNS)
    + ") ORDER BY hour, user_name, user_creator, engine_type, label"
    " ON CONFLICT (hour, user_name, user_creator, engine_type, label) DO UPDATE SET"
    " granted = usage_add(usage_hour.granted, EXCLUDED.granted), "
    + ", ".join(f"{c} = usage_hour.{c} + EXCLUDED.{c}" for c in _AMOUNT_COLUMNS)
)


@dataclass(frozen=True)
class RolledUp:
    """What one roll-up pass added: rows read per source, and their sum (for the
    metrics' counters); `behind`: a source had more than a batch."""

    rows: dict[str, int]
    ledger: Ledger
    behind: bool


async def roll_up(conn: Conn, now: datetime, batch: int) -> RolledUp:
    """One pass over every source, at most `batch` rows each, in the caller's
    transaction (see the module docstring)."""
    cur = await conn.execute("SELECT source, xid FROM usage_watermark ORDER BY source FOR UPDATE")
    marks = dict(await cur.fetchall())
    cur = await conn.execute(HORIZON)
    found = await cur.fetchone()
    assert found is not None
    horizon: int = found[0]
    counts: dict[str, int] = {}
    ledgers: list[Ledger] = []
    behind = False
    for source in SOURCES:
        rows, upto, full = await _take(conn, _READS[source], marks[source], horizon, batch)
        counts[source] = len(rows)
        behind = behind or full
        # The arithmetic off the event loop that serves heartbeats (a batch is ~20 ms).
        ledgers.append(await asyncio.to_thread(_ledger_of, source, rows))
        await conn.execute(
            "UPDATE usage_watermark SET xid = %s, rolled_at = %s WHERE source = %s",
            (upto, now, source),
        )
    ledger = merge(ledgers)
    if ledger:
        await conn.execute(_UPSERT, (json.dumps([_row_json(k, a) for k, a in ledger.items()]),))
    return RolledUp(counts, ledger, behind)


async def _take(
    conn: Conn, select: str, mark: int, horizon: int, batch: int
) -> tuple[list[tuple[Any, ...]], int, bool]:
    """The rows of `select` written from transaction `mark` up to `horizon`, at most
    about `batch` (never part of one transaction's rows); the new watermark; whether
    more are left."""
    if horizon <= mark:
        return [], mark, False
    cur = await conn.execute(f"{select} ORDER BY 1 LIMIT %s", (mark, horizon, batch))
    rows = list(await cur.fetchall())
    if len(rows) < batch:
        return rows, horizon, False
    last = rows[-1][0]
    if rows[0][0] != last:  # the last transaction's rows may go on: leave them for next
        return [r for r in rows if r[0] != last], last, True
    # One transaction wrote more than a batch (an ECM leaving ends all its tickets): all of it.
    cur = await conn.execute(f"{select} ORDER BY 1", (last, last + 1))
    return list(await cur.fetchall()), last + 1, True


def _ledger_of(source: str, rows: list[tuple[Any, ...]]) -> Ledger:
    """What `rows` add; a row the domain cannot read (written by hand, or by a version
    that stored something else) is left out, with one log line per pass."""
    convert = _CONVERT[source]
    ledgers: list[Ledger] = []
    bad = 0
    for row in rows:
        try:
            ledgers.append(convert(row))
        except (DomainError, ValueError, TypeError, KeyError, ArithmeticError):
            bad += 1
    if bad:
        log.warning("usage roll-up: %d unreadable %s rows left out of the ledger", bad, source)
    return merge(ledgers)


def _int(value: Any) -> int | None:
    return None if value is None else int(Decimal(value))


def _ticket(row: tuple[Any, ...]) -> Ledger:
    (_, user, labels, charged, requested, used, created, reported, ended, cpu, memory) = row
    user_creator, engine_type = names_of(labels)
    return ticket_usage(
        EndedTicket(
            user=user,
            user_creator=user_creator,
            engine_type=engine_type,
            charged_labels=tuple(charged),
            requested=res(requested),
            used=opt_res(used),
            created_at=created,
            reported_at=reported,
            ended_at=ended,
            measured_memory=_int(memory),
            measured_cpu=_int(cpu),
        )
    )


def _engine_conn(row: tuple[Any, ...]) -> Ledger:
    _, user, labels, created, ended, state = row
    return engine_conn_usage(
        EndedEngineConn(user, *names_of(labels), created, ended, state != "SUCCEEDED")
    )


def _demand(row: tuple[Any, ...]) -> Ledger:
    _, user, labels, to_state, at = row
    return demand_usage(DemandTransition(user, *names_of(labels), to_state, at))


_CONVERT: dict[str, Callable[[tuple[Any, ...]], Ledger]] = {
    "tickets": _ticket,
    "engine_conns": _engine_conn,
    "demands": _demand,
}


def _row_json(key: UsageKey, a: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "hour": key.hour.isoformat(),
        "user_name": key.user,
        "user_creator": key.user_creator,
        "engine_type": key.engine_type,
        "label": key.label,
        "granted": dict(a.granted),
    }
    row.update({c: getattr(a, c) for c in _AMOUNT_COLUMNS})
    return row


async def rolled_through(conn: Conn) -> datetime | None:
    """When the last roll-up pass of every source ended (the earliest of them); None
    before the first."""
    cur = await conn.execute(
        "SELECT min(rolled_at), bool_or(rolled_at IS NULL) FROM usage_watermark"
    )
    found = await cur.fetchone()
    if found is None or found[1]:
        return None
    when: datetime | None = found[0]
    return when


# ----- reports --------------------------------------------------------------------------------

_GROUP_EXPR = {
    "user": "user_name",
    "user_creator": "user_creator",
    "engine_type": "engine_type",
    "label": "label",
    "hour": "to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')",
}


async def report(conn: Conn, q: UsageQuery) -> list[UsageGroup]:
    """The groups of `q` in key order. By label, the label rows; otherwise the rows
    that count each ticket once."""
    expr = _GROUP_EXPR[q.group_by]
    sums = ", ".join(f"sum({c})" for c in _AMOUNT_COLUMNS)
    where = ["hour >= %(since)s", "hour < %(until)s", f"{expr} > %(after)s"]
    where.append("label <> ''" if q.group_by == "label" else "label = ''")
    if q.user is not None:
        where.append("user_name = %(user)s")
    cur = await conn.execute(
        f"SELECT {expr} AS k, usage_sum(granted), {sums} FROM usage_hour"  # noqa: S608
        f" WHERE {' AND '.join(where)} GROUP BY k ORDER BY k LIMIT %(limit)s",
        {"since": q.since, "until": q.until, "after": q.after, "user": q.user, "limit": q.limit},
    )
    return [
        UsageGroup(
            key=row[0],
            granted={d: int(Decimal(str(v))) for d, v in row[1].items()},
            amounts={c: int(v) for c, v in zip(_AMOUNT_COLUMNS, row[2:], strict=True)},
        )
        for row in await cur.fetchall()
    ]
