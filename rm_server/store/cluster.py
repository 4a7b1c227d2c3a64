"""What `GetClusterInfo` reads: the database's version, the registered replicas and the
applies waiting for capacity (dead replicas are reaped by the sweep, with their waiters)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rm_server.store.db import Conn

__all__ = ["EVENT_TABLES", "ClusterRow", "ReplicaRow", "cluster_info", "state_events"]


@dataclass(frozen=True)
class ReplicaRow:
    """One rm_replica row."""

    replica_id: str
    host: str
    pid: int
    started_at: datetime


@dataclass(frozen=True)
class ClusterRow:
    """The database's own view of the cluster."""

    server_version: str
    replicas: tuple[ReplicaRow, ...]
    waiting_applies: int


async def cluster_info(conn: Conn) -> ClusterRow:
    """The server version, the replicas (oldest first) and the number of waiting applies."""
    cur = await conn.execute("SHOW server_version")
    version = await cur.fetchone()
    cur = await conn.execute(
        "SELECT replica_id, host, pid, started_at FROM rm_replica ORDER BY started_at, replica_id"
    )
    replicas = tuple(ReplicaRow(str(a), str(b), int(c), d) for a, b, c, d in await cur.fetchall())
    cur = await conn.execute("SELECT count(*) FROM apply_waiter")
    waiting = await cur.fetchone()
    return ClusterRow(
        str(version[0]) if version else "", replicas, int(waiting[0]) if waiting else 0
    )


# kind -> (table, id column, reason column or '' for none)
EVENT_TABLES = {
    "node": (
        "SELECT at, state, '' FROM ecm_event WHERE instance = %s ORDER BY seq DESC LIMIT 1000"
    ),
    "engineconn": (
        "SELECT at, state, reason FROM engine_conn_event WHERE ec_id = %s"
        " ORDER BY seq DESC LIMIT 1000"
    ),
}


async def state_events(conn: Conn, kind: str, object_id: str) -> list[tuple[datetime, str, str]]:
    """(time, state, reason) of every state the object entered, oldest first (the last
    1000). `kind` is a key of EVENT_TABLES (checked by the caller)."""
    cur = await conn.execute(EVENT_TABLES[kind], (object_id,))
    rows = [(at, str(state), str(reason)) for at, state, reason in await cur.fetchall()]
    rows.reverse()
    return rows
