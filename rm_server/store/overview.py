"""Cluster-wide counts for the console's overview: what no single RPC aggregates
(waiting applies, RM replicas, demands and EngineConns by state, per user or for all)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rm_server.store.db import Conn

TOP_USERS = 10


@dataclass(frozen=True)
class Replica:
    replica_id: str
    host: str
    pid: int
    started_at: datetime


@dataclass(frozen=True)
class ClusterCounts:
    waiting_applies: int
    replicas: tuple[Replica, ...]
    engine_conns: dict[str, int]  # state -> count
    demands: dict[str, int]
    top_users: tuple[tuple[str, int], ...]  # most live tickets first (operators only)


async def cluster_counts(conn: Conn, user: str) -> ClusterCounts:
    """Counts seen by `user` ("" for an operator: everyone's). Waiting applies count
    each waiting call once, however many labels it queues on."""
    cur = await conn.execute(
        "SELECT count(DISTINCT seq) FROM apply_waiter WHERE (%s = '' OR user_name = %s)",
        (user, user),
    )
    row = await cur.fetchone()
    waiting = int(row[0]) if row else 0
    cur = await conn.execute(
        "SELECT replica_id, host, pid, started_at FROM rm_replica ORDER BY started_at"
    )
    replicas = tuple(Replica(*r) for r in await cur.fetchall())
    cur = await conn.execute(
        "SELECT state, count(*) FROM engine_conn WHERE (%s = '' OR user_name = %s) GROUP BY state",
        (user, user),
    )
    ecs = {s: int(n) for s, n in await cur.fetchall()}
    cur = await conn.execute(
        "SELECT state, count(*) FROM demand WHERE (%s = '' OR user_name = %s) GROUP BY state",
        (user, user),
    )
    demands = {s: int(n) for s, n in await cur.fetchall()}
    top: tuple[tuple[str, int], ...] = ()
    if not user:
        cur = await conn.execute(
            "SELECT user_name, count(*) FROM ticket GROUP BY user_name"
            " ORDER BY count(*) DESC, user_name LIMIT %s",
            (TOP_USERS,),
        )
        top = tuple((u, int(n)) for u, n in await cur.fetchall())
    return ClusterCounts(waiting, replicas, ecs, demands, top)
