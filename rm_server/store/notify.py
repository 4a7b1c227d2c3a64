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
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg

log = logging.getLogger(__name__)

CHANNEL = "labelrm_events"


async def notify_freed(conn: psycopg.AsyncConnection[Any], labels: Iterable[str]) -> None:
    """Queue a notification per key; PostgreSQL sends them when the transaction commits."""
    for label in sorted(set(labels)):
        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, label))


def ec_key(ec_id: str) -> str:
    return f"ec:{ec_id}"


def agent_key(agent_id: str) -> str:
    return f"agent:{agent_id}"


class LabelNotifier:
    """One LISTEN connection per process, fanning out to waiters by label."""

    def __init__(self, conninfo: str, *, reconnect_delay: float = 0.2) -> None:
        self.conninfo = conninfo
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
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True
                ) as conn:
                    await conn.execute("LISTEN labelrm_events")  # == CHANNEL
                    self._connected.set()
                    self._wake_all()
                    async for note in conn.notifies():
                        self._wake(note.payload)
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                self._connected.clear()
                log.warning("notification listener lost its connection: %s", exc)
                await asyncio.sleep(self.reconnect_delay)
