"""Wake-ups across replicas: PostgreSQL LISTEN/NOTIFY on one channel.

Payloads are keys: a label text (`key=value,...`, always containing "=") when
capacity was freed on it (release, report of less than was locked, expiry,
unregister, a limit change, a waiter leaving its queue), `ec:<id>` when an
EngineConn changed state, `agent:<id>` when an agent has new commands.
PostgreSQL delivers them on commit to every replica. Each replica keeps one
listening connection and sets the in-process events subscribed to that key.
After a reconnect every subscriber is woken once, since notifications sent
while disconnected are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql

from rm_server.store.db import ping

log = logging.getLogger(__name__)

CHANNEL = "labelrm_events"
# Reconnecting after a lost connection: the first try at once-ish, then backing off
# (doubling) to at most RECONNECT_MAX seconds while the database stays away.
RECONNECT_MIN = 0.2
RECONNECT_MAX = 5.0
# A quiet LISTEN connection is probed this often: a frozen server (its kernel still
# acknowledging keepalives) would otherwise hold the listener, and so every wake-up,
# until it thawed.
PROBE_INTERVAL = 5.0
PROBE_TIMEOUT = 5.0


# One statement for any number of keys (one round trip, not one per key).
NOTIFY_KEYS = "SELECT count(pg_notify(%s, k)) FROM unnest(%s::text[]) AS k"


async def notify_freed(conn: psycopg.AsyncConnection[Any], labels: Iterable[str]) -> None:
    """Queue a notification per key; PostgreSQL sends them when the transaction commits.
    (A statement that changes a row can notify itself, in the same round trip:
    `change_and_notify`.)"""
    keys = sorted(set(labels))
    if keys:
        await conn.execute(NOTIFY_KEYS, (CHANNEL, keys))


async def change_and_notify(
    conn: psycopg.AsyncConnection[Any],
    change: sql.Composable,
    params: Sequence[Any],
    key: str,
    notify: bool = True,
) -> int:
    """Run `change` (one UPDATE or INSERT, without RETURNING, positional parameters) and,
    if it changed a row and `notify`, queue the notification of `key`: one statement, one
    round trip. The number of rows changed."""
    query = sql.SQL(
        "WITH u AS ({} RETURNING 1) SELECT (SELECT count(*) FROM u),"
        " (SELECT count(pg_notify(%s, %s)) FROM u WHERE %s::boolean)"
    ).format(change)
    cur = await conn.execute(query, (*params, CHANNEL, key, notify))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


def ec_key(ec_id: str) -> str:
    return f"ec:{ec_id}"


def agent_key(agent_id: str) -> str:
    return f"agent:{agent_id}"


class LabelNotifier:
    """One LISTEN connection per process, fanning out to waiters by label; `connect`
    opens it (Database.connect: keepalives and timeouts)."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        *,
        reconnect_delay: float = RECONNECT_MIN,
    ) -> None:
        self.connect = connect
        self.reconnect_delay = reconnect_delay
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="label-notifier")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._connected.wait(), timeout=10)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.contextmanager
    def subscribe(self, labels: Iterable[str]) -> Iterator[asyncio.Event]:
        """An event set whenever one of `labels` is freed (and after reconnects)."""
        event = asyncio.Event()
        keys = sorted(set(labels))
        for label in keys:
            self._waiters.setdefault(label, set()).add(event)
        try:
            yield event
        finally:
            for label in keys:
                group = self._waiters.get(label)
                if group is not None:
                    group.discard(event)
                    if not group:
                        del self._waiters[label]

    def _wake(self, label: str) -> None:
        for event in self._waiters.get(label, ()):
            event.set()

    def _wake_all(self) -> None:
        for group in self._waiters.values():
            for event in group:
                event.set()

    async def _listen_forever(self) -> None:
        delay = self.reconnect_delay
        lost_at: float | None = None  # when the current outage began
        while True:
            try:
                async with await self.connect() as conn:
                    await conn.execute("LISTEN labelrm_events")  # == CHANNEL
                    if lost_at is not None:
                        log.info(
                            "notification listener reconnected after %.1f s",
                            time.monotonic() - lost_at,
                        )
                    lost_at, delay = None, self.reconnect_delay
                    self._connected.set()
                    self._wake_all()
                    await self._relay(conn)
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                self._connected.clear()
                if lost_at is None:  # one line per outage, not one per try
                    lost_at = time.monotonic()
                    reason = " ".join(str(exc).split()) or type(exc).__name__
                    log.warning("notification listener lost its connection: %s", reason)
                await asyncio.sleep(delay)
                delay = min(RECONNECT_MAX, 2 * delay)

    async def _relay(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Wake the subscribers of each notification; probe the server when quiet."""
        while True:
            async for note in conn.notifies(timeout=PROBE_INTERVAL):
                self._wake(note.payload)
            await ping(conn, PROBE_TIMEOUT)
