"""The liveness judge's shared state: one row (migration 0018), whichever replica judges.

`heard_since` only ever moves forward (`greatest`): a replica that began to hear again
cannot pull back the mark another one set later."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rm_server.domain.liveness import LivenessRecord
from rm_server.store.db import Conn


def _record(row: tuple[Any, ...]) -> LivenessRecord:
    """From the columns (heard_since ... judge) the statements below return."""
    heard_since, reason, judged_at, disrupted_since, silent, agents, judge = row
    return LivenessRecord(
        heard_since, reason, judged_at, disrupted_since, silent, agents, judge or ""
    )


# %(forget_judge)s: after a start nobody has judged since (the next judge is no takeover).
_HEAR_SINCE_SQL = (
    "INSERT INTO liveness (heard_since, heard_since_reason) VALUES (%(at)s, %(why)s)"
    " ON CONFLICT (id) DO UPDATE SET"
    " heard_since_reason = CASE WHEN EXCLUDED.heard_since > liveness.heard_since"
    "  THEN EXCLUDED.heard_since_reason ELSE liveness.heard_since_reason END,"
    " heard_since = greatest(liveness.heard_since, EXCLUDED.heard_since),"
    " judge = CASE WHEN %(forget_judge)s THEN NULL ELSE liveness.judge END"
    " RETURNING heard_since, heard_since_reason, judged_at, disrupted_since,"
    " silent_agents, agents, judge"
)
_READ_SQL = (
    "SELECT heard_since, heard_since_reason, judged_at, disrupted_since, silent_agents,"
    " agents, judge FROM liveness"
)


async def hear_since(
    conn: Conn, at: datetime, reason: str, *, started: bool = False
) -> LivenessRecord:
    """Move the mark forward to `at` (`reason` says why), unless it is later already.
    `started`: a replica started, and the judge's next pass is no takeover."""
    cur = await conn.execute(_HEAR_SINCE_SQL, {"at": at, "why": reason, "forget_judge": started})
    row = await cur.fetchone()
    assert row is not None
    return _record(row)


async def read(conn: Conn) -> LivenessRecord | None:
    """The state (None before any replica started on this database)."""
    cur = await conn.execute(_READ_SQL)
    row = await cur.fetchone()
    return _record(row) if row is not None else None


async def record_pass(
    conn: Conn,
    judge: str,
    judged_at: datetime,
    disrupted_since: datetime | None,
    counted: tuple[int, int] | None,
) -> None:
    """What the pass of replica `judge` at `judged_at` found: the disruption's start
    (None: none) and, if it counted them, (silent agents, agents not LOST)."""
    await conn.execute(
        "UPDATE liveness SET judge = %(judge)s, judged_at = %(at)s, disrupted_since = %(since)s,"
        " silent_agents = coalesce(%(silent)s, silent_agents),"
        " agents = coalesce(%(agents)s, agents)",
        {
            "judge": judge,
            "at": judged_at,
            "since": disrupted_since,
            "silent": counted[0] if counted else None,
            "agents": counted[1] if counted else None,
        },
    )
