"""Replica presence: each RM replica holds a session advisory lock on a connection of
its own for as long as it lives, and records it in rm_replica. When the replica dies
(kill -9, a lost host) PostgreSQL ends its session and frees the lock; the sweep of
any live replica then finds the lock free and removes the replica and every waiting
apply it served, so they stop holding capacity back within a sweep interval instead
of at their wait deadline."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from rm_server.store.db import Conn
from rm_server.store.notify import notify_freed
from rm_server.store.waiters import locked_waiters


@dataclass
class Presence:
    """This replica's id and the session that holds its lock (closed on stop)."""

    replica_id: str
    lock_key: int
    session: psycopg.AsyncConnection[Any]

    async def alive(self) -> bool:
        """Whether the session (and so the lock) survives: False after the database
        restarted or the connection broke; the replica then joins again."""
        if self.session.closed:
            return False
        try:
            await self.session.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    async def leave(self) -> None:
        """Remove this replica's row (its waiters go with it), then end its session."""
        with contextlib.suppress(psycopg.Error):
            await _forget(self.session, self.replica_id)
        with contextlib.suppress(psycopg.Error):
            await self.session.close()


async def join(conninfo: str, replica_id: str, now: datetime) -> Presence:
    """Open this replica's session, take its advisory lock and record it (again, with
    a new lock, when its earlier session was lost)."""
    session = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        lock_key = secrets.randbits(62) + 1
        await session.execute("SELECT pg_advisory_lock(%s)", (lock_key,))
        await session.execute(
            "INSERT INTO rm_replica (replica_id, lock_key, host, pid, started_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (replica_id) DO UPDATE"
            " SET lock_key = EXCLUDED.lock_key, started_at = EXCLUDED.started_at",
            (replica_id, lock_key, socket.gethostname(), os.getpid(), now),
        )
    except BaseException:
        await session.close()
        raise
    return Presence(replica_id, lock_key, session)


async def _forget(conn: Conn, replica_id: str) -> int:
    cur = await conn.execute(
        f"DELETE FROM apply_waiter w USING ({locked_waiters('replica_id = %s')}) k"  # noqa: S608
        " WHERE w.label = k.label AND w.seq = k.seq RETURNING w.label",
        (replica_id,),
    )
    labels = [r[0] for r in await cur.fetchall()]
    await conn.execute("DELETE FROM rm_replica WHERE replica_id = %s", (replica_id,))
    await notify_freed(conn, labels)
    return len(labels)


async def reap_dead(conn: Conn) -> list[str]:
    """Remove every replica whose lock is free (its session ended) and its waiters;
    returns their ids. A probe that gets a lock releases it at once."""
    cur = await conn.execute("SELECT replica_id, lock_key FROM rm_replica ORDER BY replica_id")
    dead = []
    for replica_id, lock_key in await cur.fetchall():
        probe = await conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key,))
        got = await probe.fetchone()
        if got is None or not got[0]:
            continue  # held: the replica lives
        await conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key,))
        await _forget(conn, replica_id)
        dead.append(replica_id)
    return dead
