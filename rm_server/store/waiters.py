"""The queue of waiting applies: one apply_waiter row per (waiter, label), with what it
waits for, its user, its replica and the end of its hold (docs/architecture.md,
"Waiting applies and fairness"). store/tickets.py reads the queue with the label rows
and serves waiters; store/replicas.py removes the waiters of dead replicas.

Every statement that changes several waiter rows locks them first in their key order,
(label, seq) (``locked_waiters``): a group serving its waiters, the sweep dropping
expired ones and a replica's waiters being removed may meet on the same rows, and each
taking them in its own scan order could deadlock."""

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


def locked_waiters(condition: str) -> str:
    """A sub-select of the (label, seq) keys of the waiter rows matching `condition` (a
    constant SQL fragment, parameters as placeholders), locked in key order."""
    return (
        f"SELECT label, seq FROM apply_waiter WHERE {condition}"  # noqa: S608 - constant
        " ORDER BY label, seq FOR UPDATE"
    )


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
    await conn.execute(
        "UPDATE apply_waiter w SET hold_until = %s"  # noqa: S608 - constant fragments
        f" FROM ({locked_waiters('seq = %s')}) k WHERE w.label = k.label AND w.seq = k.seq",
        (hold_until, seq),
    )


async def remove_waiter(conn: Conn, seq: int) -> None:
    """Leave the queue; waiters behind it may now go, so wake them."""
    cur = await conn.execute(
        f"DELETE FROM apply_waiter w USING ({locked_waiters('seq = %s')}) k"  # noqa: S608
        " WHERE w.label = k.label AND w.seq = k.seq RETURNING w.label",
        (seq,),
    )
    await notify_freed(conn, [r[0] for r in await cur.fetchall()])


async def purge_waiters(conn: Conn, now: datetime) -> int:
    """Drop waiters whose deadline passed (their replica may have died)."""
    cur = await conn.execute(
        f"DELETE FROM apply_waiter w USING ({locked_waiters('expires_at <= %s')}) k"  # noqa: S608
        " WHERE w.label = k.label AND w.seq = k.seq RETURNING w.label",
        (now,),
    )
    labels = [r[0] for r in await cur.fetchall()]
    await notify_freed(conn, labels)
    return len(labels)
