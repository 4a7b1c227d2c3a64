"""Injected time and ids: store writes take their timestamps and ids from here,
so time-dependent behaviour (lock expiry, waiters) is testable without waiting."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


IdFactory = Callable[[str], str]


def random_ids(prefix: str) -> str:
    """`t-0193f2a4c1b2…`: a prefix naming the kind of object, then 32 hex digits: 12 of
    the time in milliseconds and 20 (80 bits) random. Ids made later sort later, so a
    table keyed by them (ticket, ticket_history, request_log, ...) grows at the right
    edge of its primary-key index: with fully random ids each insert into a table of
    millions of rows touched a random page of an index far larger than the cache, and
    after every checkpoint wrote that whole page to the WAL again."""
    millis = time.time_ns() // 1_000_000
    return f"{prefix}-{millis & 0xFFFF_FFFF_FFFF:012x}{secrets.token_hex(10)}"
