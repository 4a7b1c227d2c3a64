"""Injected time and ids: store writes take their timestamps and ids from here,
so time-dependent behaviour (lock expiry, waiters) is testable without waiting."""

from __future__ import annotations

import threading
import uuid
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
    """`t-3f2a…`: a prefix naming the kind of object, then 32 random hex digits."""
    return f"{prefix}-{uuid.uuid4().hex}"
