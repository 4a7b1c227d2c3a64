"""Bounded reads for lists a person looks at (the web console): the most recent rows of a
kind up to a cap, the exact counts by state beside them (so a cut list says how much it
left out), live tickets summed per user or engine type, and what each label held over
the last hour, rebuilt from the tickets and the ended tickets' history.

Each is one statement; none reads more than its `limit` rows back (the sums and counts
are computed by PostgreSQL)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from rm_server.domain.demands.model import Demand
from rm_server.domain.engineconn import EngineConn
from rm_server.domain.model import Ticket
from rm_server.store import demands as demand_store
from rm_server.store.codec import TICKET_COLUMNS, ticket_from_json
from rm_server.store.db import Conn, page_filters
from rm_server.store.engineconns import EC_COLUMNS, ec_from_row

# The dimensions of a stored resource (Resource.to_dict: quantities beside "kind" and
# "queue", or under "quantities" for a special one), as rows of (dimension, quantity).
_DIMS = "jsonb_each(CASE WHEN {r} ? 'quantities' THEN {r}->'quantities' ELSE {r} - 'kind' - 'queue' END)"  # noqa: E501


T = TypeVar("T")


@dataclass(frozen=True)
class Recent(Generic[T]):
    """The newest `rows` of a selection (at most the limit asked), and how many rows of
    each state the same selection without the state filter holds."""

    rows: tuple[T, ...]
    by_state: dict[str, int]


async def _by_state(conn: Conn, table: str, where: str, values: Sequence[Any]) -> dict[str, int]:
    cur = await conn.execute(
        f"SELECT state, count(*) FROM {table} WHERE {where} GROUP BY state",  # noqa: S608
        values,
    )
    return {str(s): int(n) for s, n in await cur.fetchall()}


async def recent_tickets(
    conn: Conn, user: str, owner: str, states: Sequence[str], limit: int
) -> Recent[Ticket]:
    """Live tickets, newest id first: `user` "" for everyone's (an operator), `owner` a
    user an operator picked, `states` () for all."""
    where, values = page_filters(("user_name = %s", user or owner))
    counts = await _by_state(conn, "ticket", where, values)
    if states:
        where, values = f"{where} AND state = ANY(%s)", [*values, list(states)]
    cur = await conn.execute(
        "SELECT coalesce(json_agg(q ORDER BY q.ticket_id DESC), '[]') FROM ("  # noqa: S608
        f"SELECT {TICKET_COLUMNS} FROM ticket WHERE {where}"
        " ORDER BY ticket_id DESC LIMIT %s) q",
        (*values, limit),
    )
    row = await cur.fetchone()
    assert row is not None
    return Recent(tuple(ticket_from_json(r) for r in row[0]), counts)


async def recent_engine_conns(
    conn: Conn, user: str, owner: str, node: str, states: Sequence[str], limit: int
) -> Recent[EngineConn]:
    """EngineConns (live and ended), newest id first, filtered as `recent_tickets`,
    `node` "" for every ECM."""
    where, values = page_filters(("user_name = %s", user or owner), ("ecm_instance = %s", node))
    counts = await _by_state(conn, "engine_conn", where, values)
    if states:
        where, values = f"{where} AND state = ANY(%s)", [*values, list(states)]
    cur = await conn.execute(
        f"SELECT {EC_COLUMNS} FROM engine_conn WHERE {where}"  # noqa: S608
        " ORDER BY ec_id DESC LIMIT %s",
        (*values, limit),
    )
    return Recent(tuple(ec_from_row(r) for r in await cur.fetchall()), counts)


async def recent_demands(
    conn: Conn, user: str, owner: str, states: Sequence[str], limit: int
) -> Recent[Demand]:
    """Demands, the most recently submitted first, filtered as `recent_tickets`."""
    where, values = page_filters(("user_name = %s", user or owner))
    counts = await _by_state(conn, "demand", where, values)
    if states:
        where, values = f"{where} AND state = ANY(%s)", [*values, list(states)]
    cur = await conn.execute(
        f"SELECT {demand_store.COLUMNS} FROM demand WHERE {where}"  # noqa: S608
        " ORDER BY submitted_at DESC, user_name, demand_id LIMIT %s",
        (*values, limit),
    )
    return Recent(tuple(demand_store.from_row(r) for r in await cur.fetchall()), counts)


@dataclass(frozen=True)
class GroupTotal:
    """Live tickets of one group (a user, an engine type): how many, and their locked and
    used resources summed per dimension (dimensions added by name across kinds)."""

    tickets: int
    locked: dict[str, int]
    used: dict[str, int]


_GROUP = {
    "user": "user_name",
    "engine_type": (
        "coalesce((SELECT l->>1 FROM jsonb_array_elements(labels) l"
        " WHERE l->>0 = 'engineType' LIMIT 1), '(none)')"
    ),
}


async def ticket_totals(
    conn: Conn, user: str, by: str, limit: int
) -> tuple[dict[str, GroupTotal], int]:
    """Live tickets summed per group `by` ("user" or "engine_type"), over every live
    ticket of `user` ("" for everyone's): the `limit` groups with the most tickets, and
    how many groups there are in all."""
    group = _GROUP[by]
    where, values = page_filters(("user_name = %s", user))
    cur = await conn.execute(
        f"WITH t AS (SELECT {group} AS g, locked, used FROM ticket WHERE {where}),"  # noqa: S608
        " n AS (SELECT g, count(*) AS c FROM t GROUP BY g),"
        " top AS (SELECT g, c FROM n ORDER BY c DESC, g LIMIT %s)"
        " SELECT top.g, top.c, f.field, d.key, sum(d.value::numeric), (SELECT count(*) FROM n)"
        " FROM top JOIN t USING (g)"
        " CROSS JOIN LATERAL (VALUES ('locked', t.locked), ('used', t.used)) f(field, r)"
        f" CROSS JOIN LATERAL {_DIMS.format(r='f.r')} d"
        " GROUP BY 1, 2, 3, 4",
        (*values, limit),
    )
    out: dict[str, GroupTotal] = {}
    groups = 0
    for g, count, field, dim, total, all_groups in await cur.fetchall():
        groups = int(all_groups)
        entry = out.setdefault(str(g), GroupTotal(int(count), {}, {}))
        if total:
            getattr(entry, field)[str(dim)] = int(total)
    return out, groups


async def held_deltas(
    conn: Conn, labels: Sequence[str], since: datetime, step_seconds: float, buckets: int
) -> list[tuple[str, str, int, int]]:
    """What `labels` held over time, as changes: (label, dimension, bucket, change), where
    bucket i is the moment ``since + i * step`` and a change counts from the first
    moment at or after it (bucket 0: at or before `since`). Rebuilt from the live tickets
    (requested while locked, then what was reported used) and the history of the tickets
    that ended after `since` (the same, until they ended): what the records held, as far
    back as the history is kept."""
    cur = await conn.execute(
        "WITH iv(label, r, t0, t1) AS ("  # noqa: S608 - constant fragments only
        "  SELECT l, t.requested, t.created_at, CASE WHEN t.state = 'USED' THEN t.updated_at END"
        "  FROM ticket t, unnest(t.charged_labels) l WHERE t.charged_labels && %(labels)s"
        "  UNION ALL SELECT l, t.used, t.updated_at, NULL"
        "  FROM ticket t, unnest(t.charged_labels) l"
        "  WHERE t.state = 'USED' AND t.charged_labels && %(labels)s"
        "  UNION ALL SELECT l, h.requested, h.created_at, coalesce(h.reported_at, h.ended_at)"
        "  FROM ticket_history h, unnest(h.charged_labels) l"
        "  WHERE h.ended_at > %(since)s AND h.charged_labels && %(labels)s"
        "  UNION ALL SELECT l, h.used, h.reported_at, h.ended_at"
        "  FROM ticket_history h, unnest(h.charged_labels) l WHERE h.ended_at > %(since)s"
        "  AND h.used IS NOT NULL AND h.reported_at IS NOT NULL"
        "  AND h.charged_labels && %(labels)s"
        "), ev(label, r, at, sign) AS ("
        "  SELECT label, r, t0, 1 FROM iv UNION ALL"
        "  SELECT label, r, t1, -1 FROM iv WHERE t1 IS NOT NULL"
        "), b AS ("
        "  SELECT label, r, sign,"
        "  greatest(0, ceil(extract(epoch FROM at - %(since)s) / %(step)s))::int AS bucket"
        "  FROM ev WHERE label = ANY(%(labels)s)"
        ")"
        " SELECT label, d.key, bucket, sum(sign * d.value::numeric)"
        f" FROM b, {_DIMS.format(r='r')} d"
        " WHERE bucket < %(buckets)s GROUP BY 1, 2, 3",
        {"labels": list(labels), "since": since, "step": step_seconds, "buckets": buckets},
    )
    return [(str(a), str(b), int(c), int(d)) for a, b, c, d in await cur.fetchall()]
