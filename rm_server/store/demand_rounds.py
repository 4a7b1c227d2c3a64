"""The planner's pass over its blocked demands in SQL: one read, one UPDATE.

A blocked demand is an ALLOCATING one whose last allocation was refused. While its
labels have no more room than when it was refused (``ledger.more_room``), its round
only counts (``rounds``, the ``^N`` of its window), moves its occupation of the plan
with the time, and dates the next round. Doing that one transaction per demand, with
its label rows locked, made a pass over many blocked demands take as long as their
number, and held the very labels the submissions and applies on them need. Here the
due ones are read once (no lock), and one statement counts the round of every one the
caller found unchanged: it takes the demand rows it can (``SKIP LOCKED``: a row another
replica's round or a cancel holds is left to its next round) and none of the label rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rm_server.domain.demands.state import DemandState
from rm_server.store.db import Conn

ALLOCATING = DemandState.ALLOCATING.value


@dataclass(frozen=True)
class PassedOver:
    """One blocked demand's round: counted only if no other round counted it since it was
    read (``rounds`` as read), with its occupation of the plan from now on."""

    user: str
    demand_id: str
    rounds: int
    plan_start: datetime
    plan_end: datetime | None


@dataclass(frozen=True)
class BlockedRow:
    """What a round of a blocked demand reads of its row (its definition is known)."""

    user: str
    demand_id: str
    rounds: int
    closed_at: datetime | None
    charged_labels: tuple[str, ...]


async def blocked_due(
    conn: Conn, keys: Sequence[tuple[str, str]], due: datetime, limit: int
) -> list[BlockedRow]:
    """Of the (user, demand id) pairs ``keys``, the ALLOCATING demands due by ``due``,
    earliest first, at most ``limit``: read, not locked."""
    if not keys:
        return []
    # The keys as one JSON text: far cheaper to send from Python than two arrays.
    cur = await conn.execute(
        "SELECT user_name, demand_id, rounds, closed_at, charged_labels FROM demand"
        " WHERE state = %s AND next_check_at <= %s AND (user_name, demand_id) IN"
        " (SELECT k->>0, k->>1 FROM json_array_elements(%s::json) k)"
        " ORDER BY next_check_at LIMIT %s",
        (ALLOCATING, due, json.dumps(keys), limit),
    )
    return [
        BlockedRow(user, demand_id, rounds, closed_at, tuple(charged))
        for user, demand_id, rounds, closed_at, charged in await cur.fetchall()
    ]


async def pass_over(
    conn: Conn,
    rounds: Sequence[PassedOver],
    due: datetime,
    next_check: datetime,
    now: datetime,
) -> list[tuple[str, str]]:
    """Count one passed-over round for each of ``rounds`` still ALLOCATING, due by ``due``
    and not counted since it was read, and date its next round ``next_check``: one
    statement. Returns the (user, demand id) pairs it counted."""
    if not rounds:
        return []
    cur = await conn.execute(
        "WITH v AS (SELECT * FROM json_to_recordset(%s::json)"
        "  AS v(user_name text, demand_id text, rounds int,"
        "  plan_start timestamptz, plan_end timestamptz)),"
        " held AS (SELECT d.user_name, d.demand_id, v.plan_start, v.plan_end"
        "  FROM demand d JOIN v ON d.user_name = v.user_name AND d.demand_id = v.demand_id"
        "  WHERE d.state = %s AND d.rounds = v.rounds AND d.next_check_at <= %s"
        "  FOR UPDATE OF d SKIP LOCKED)"
        " UPDATE demand d SET rounds = d.rounds + 1, next_check_at = %s,"
        " plan_start = held.plan_start, plan_end = held.plan_end, updated_at = %s"
        " FROM held WHERE d.user_name = held.user_name AND d.demand_id = held.demand_id"
        " RETURNING d.user_name, d.demand_id",
        (
            _rounds_json(rounds),
            ALLOCATING,
            due,
            next_check,
            now,
        ),
    )
    return [(user, demand_id) for user, demand_id in await cur.fetchall()]


def _rounds_json(rounds: Sequence[PassedOver]) -> str:
    """The rounds as one JSON text (json_to_recordset): far cheaper to send from Python
    than five arrays."""
    return json.dumps(
        [
            {
                "user_name": r.user,
                "demand_id": r.demand_id,
                "rounds": r.rounds,
                "plan_start": r.plan_start.isoformat(),
                "plan_end": None if r.plan_end is None else r.plan_end.isoformat(),
            }
            for r in rounds
        ]
    )
