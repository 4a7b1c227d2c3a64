"""The queue of waiting applies: one apply_waiter row per (waiter, label), with what it
waits for, its user, its replica and the end of its hold (docs/architecture.md,
"Waiting applies and fairness"). store/tickets.py reads the queue with the label rows
and serves waiters; store/replicas.py removes the waiters of dead replicas."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rm_server.domain.resources import Resource
from rm_server.store.codec import jres
from rm_server.store.db import Conn
from rm_server.store.notify import notify_freed


@dataclass(frozen=True)
class WaiterEntry:
    """A waiting apply to queue: who, for what, for which replica, holding until when."""

    waiter_id: str
    labels: tuple[str, ...]
    expires_at: datetime
    user: str = ""
    resource: Resource | None = None
    replica_id: str = ""
    hold_until: datetime | None = None


async def register_waiter(conn: Conn, entry: WaiterEntry) -> int:
    """Queue a waiting apply on each of its labels; returns its global sequence number."""
    cur = await conn.execute("SELECT nextval('apply_waiter_seq')")
    row = await cur.fetchone()
    assert row is not None
    seq = int(row[0])
    await conn.execute(
        "INSERT INTO apply_waiter (label, seq, waiter_id, expires_at, user_name, resource,"
        " replica_id, hold_until) SELECT unnest(%s::text[]), %s, %s, %s, %s, %s, %s, %s",
        (
            list(entry.labels),
            seq,
            entry.waiter_id,
            entry.expires_at,
            entry.user,
            jres(entry.resource),
            entry.replica_id,
            entry.hold_until,
        ),
    )
    return seq


async def set_waiter_hold(conn: Conn, seq: int, hold_until: datetime) -> None:
    """Move the end of a waiter's hold (to now: it holds nothing from here)."""
    await conn.execute("UPDATE apply_waiter SET hold_until = %s WHERE seq = %s", (hold_until, seq))


async def remove_waiter(conn: Conn, seq: int) -> None:
    """Leave the queue; waiters behind it may now go, so wake them."""
    cur = await conn.execute("DELETE FROM apply_waiter WHERE seq = %s RETURNING label", (seq,))
    await notify_freed(conn, [r[0] for r in await cur.fetchall()])


async def purge_waiters(conn: Conn, now: datetime) -> int:
    """Drop waiters whose deadline passed (their replica may have died)."""
    cur = await conn.execute(
        "DELETE FROM apply_waiter WHERE expires_at <= %s RETURNING label", (now,)
    )
    labels = [r[0] for r in await cur.fetchall()]
    await notify_freed(conn, labels)
    return len(labels)
