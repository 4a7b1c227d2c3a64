"""Parked demands in SQL (docs/demands.md, "How the RM plans and allocates").

A demand that waits for something other than the time is parked (migration 0023): an
ALLOCATING one refused for lack of room, until its labels have more room; an ACCEPTED
one waiting for its OrderBy, until a demand it names ends. It gets no round meanwhile
but at ``next_check_at``, the next instant its decision may change by itself
(planner.park_until). A pass then costs what changed, not what waits: rewriting every
blocked demand's row in every pass (its round counted, its occupation moved, its next
round dated; ``next_check_at`` being indexed, every index of the row) cost as much as
the blocked demands. While parked, its passed-over rounds count on with the time and its
occupation of the plan starts now (``demands.plan_entries`` computes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from rm_server.domain.demands.model import Demand
from rm_server.store.db import Conn


async def park(
    conn: Conn,
    d: Demand,
    now: datetime,
    parked_at: datetime,
    next_check: datetime,
    default_hold: timedelta,
) -> Demand:
    """Park a locked demand from the pass that began at ``parked_at`` until ``next_check``
    (or a wake): with ``d.rounds`` as counted up to then, and what its occupation of the
    plan is computed from while parked (``_OCCUPATION``): its hold, ``default_hold``
    without Duration and DeadLine."""
    hold = d.view().hold
    seconds = hold.duration or (None if hold.deadline else default_hold)
    await conn.execute(
        "UPDATE demand SET rounds = %s, parked_at = %s, next_check_at = %s,"
        " park_hold_seconds = %s, park_deadline = %s, updated_at = %s"
        " WHERE user_name = %s AND demand_id = %s",
        (
            d.rounds,
            parked_at,
            next_check,
            None if seconds is None else seconds.total_seconds(),
            hold.deadline,
            now,
            d.user,
            d.demand_id,
        ),
    )
    return replace(d, parked_at=parked_at, next_check_at=next_check, updated_at=now)


async def blocked_count(conn: Conn) -> int:
    """How many demands are parked blocked (ALLOCATING, refused for lack of room)."""
    cur = await conn.execute(
        "SELECT count(*) FROM demand WHERE parked_at IS NOT NULL AND state = 'ALLOCATING'"
    )
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


async def blocked_keys(conn: Conn) -> set[tuple[str, str]]:
    """The (user, demand id) pairs of the demands parked blocked."""
    cur = await conn.execute(
        "SELECT user_name, demand_id FROM demand"
        " WHERE parked_at IS NOT NULL AND state = 'ALLOCATING'"
    )
    return {(user, demand_id) for user, demand_id in await cur.fetchall()}


async def wake(conn: Conn, keys: Sequence[tuple[str, str]], at: datetime) -> int:
    """Make the parked demands ``keys`` due at ``at``: one statement; how many. A row
    another transaction holds (a cancel, a claim) is skipped, not waited for: still
    parked after it, the next pass finds it unknown (BlockedIndex) and wakes it then."""
    if not keys:
        return 0
    cur = await conn.execute(
        "UPDATE demand d SET next_check_at = %s FROM (SELECT user_name, demand_id FROM demand"
        "  WHERE (user_name, demand_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
        "  AND parked_at IS NOT NULL AND next_check_at > %s FOR UPDATE SKIP LOCKED) k"
        " WHERE d.user_name = k.user_name AND d.demand_id = k.demand_id",
        (at, [u for u, _ in keys], [i for _, i in keys], at),
    )
    return cur.rowcount


async def wake_successors(conn: Conn, user: str, demand_id: str, at: datetime) -> int:
    """Make due at ``at`` the ACCEPTED demands of `user` whose OrderBy names `demand_id`
    (it ended: their OrderBy may hold, or never). A statement of its own, after the end
    committed: it locks their rows, which come before any label row in the lock order."""
    cur = await conn.execute(
        "UPDATE demand SET next_check_at = %s WHERE state = 'ACCEPTED'"
        " AND order_by_ids @> ARRAY[%s]::text[] AND user_name = %s AND next_check_at > %s",
        (at, demand_id, user, at),
    )
    return cur.rowcount
