"""Cluster-wide counts for the console's overview: what no single RPC aggregates
(waiting applies, RM replicas, demands and EngineConns by state, per user or for all)."""

from __future__ import annotations

from dataclasses import dataclass

from rm_server.store import cluster
from rm_server.store.db import Conn

TOP_USERS = 10


@dataclass(frozen=True)
class ClusterCounts:
    waiting_applies: int
    replicas: tuple[cluster.ReplicaRow, ...]
    engine_conns: dict[str, int]  # state -> count
    demands: dict[str, int]
    top_users: tuple[tuple[str, int], ...]  # most live tickets first (operators only)


async def cluster_counts(conn: Conn, user: str) -> ClusterCounts:
    """Counts seen by `user` ("" for an operator: everyone's). Waiting applies count
    each waiting call once, however many labels it queues on."""
    waiting = await cluster.waiting_applies(conn, user)
    replicas = await cluster.list_replicas(conn)
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
