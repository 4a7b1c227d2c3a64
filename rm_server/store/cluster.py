"""What `GetClusterInfo` reads: the database's version, the registered replicas and the
applies waiting for capacity (dead replicas are reaped by the sweep, with their waiters)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rm_server.domain.model import Ticket, TicketState
from rm_server.errors import NotFound
from rm_server.store import demands
from rm_server.store.db import Conn
from rm_server.store.ticket_reads import get_ticket

__all__ = [
    "EVENT_TABLES",
    "ClusterRow",
    "ReplicaRow",
    "cluster_info",
    "state_events",
    "ticket_events",
]


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
    return ClusterRow(
        str(version[0]) if version else "", await list_replicas(conn), await waiting_applies(conn)
    )


async def list_replicas(conn: Conn) -> tuple[ReplicaRow, ...]:
    """The live replicas' rows, oldest first."""
    cur = await conn.execute(
        "SELECT replica_id, host, pid, started_at FROM rm_replica ORDER BY started_at, replica_id"
    )
    return tuple(ReplicaRow(str(a), str(b), int(c), d) for a, b, c, d in await cur.fetchall())


async def waiting_applies(conn: Conn, user: str = "") -> int:
    """Waiting Apply calls (each once, however many labels it queues on); `user` "" for
    everyone's."""
    cur = await conn.execute(
        "SELECT count(DISTINCT seq) FROM apply_waiter WHERE (%s = '' OR user_name = %s)",
        (user, user),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


# kind -> the query of its recorded states (ECMs and EngineConns: written by triggers; a
# node's outlive it).
_EVENT_QUERIES = {
    "node": (
        "SELECT at, state, reason FROM ecm_event WHERE instance = %s ORDER BY seq DESC LIMIT 1000"
    ),
    "engineconn": (
        "SELECT at, state, reason FROM engine_conn_event WHERE ec_id = %s"
        " ORDER BY seq DESC LIMIT 1000"
    ),
}
EVENT_TABLES = frozenset((*_EVENT_QUERIES, "ticket", "demand"))

Event = tuple[datetime, str, str]


def ticket_events(t: Ticket) -> list[Event]:
    """A ticket's states from its own times: locked when applied, used when reported,
    then how it ended (a live ticket keeps the time of its last report)."""
    what = f"applied for EngineConn {t.engine_conn_id}" if t.engine_conn_id else "applied"
    events = [(t.created_at, TicketState.LOCKED.value, what)]
    if t.used is not None:
        events.append((t.updated_at, TicketState.USED.value, "reported used"))
    if t.ended_at is not None:
        events.append((t.ended_at, t.state.value, t.end_reason))
    return events


async def state_events(conn: Conn, kind: str, object_id: str, user: str = "") -> list[Event]:
    """(time, state, reason) of every state the object entered, oldest first (the last
    1000). `kind` is one of EVENT_TABLES (checked by the caller); `user` names a demand's
    user (empty: the one demand of that id). NotFound for an unknown ticket or demand."""
    if kind == "ticket":
        return ticket_events(await get_ticket(conn, object_id))
    if kind == "demand":
        d = await demands.get(conn, user or None, object_id, with_events=True)
        if d is None:
            raise NotFound(f"demand {object_id} not found")
        return [(e.at, e.to_state.value, e.reason) for e in d.events[-1000:]]
    cur = await conn.execute(_EVENT_QUERIES[kind], (object_id,))
    rows = [(at, str(state), str(reason)) for at, state, reason in await cur.fetchall()]
    rows.reverse()
    return rows
