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
    def now(self) -> datetime:
        """The wall-clock time, timezone-aware (what is recorded and compared in rows)."""
        ...

    def monotonic(self) -> float:
        """Seconds of a clock that never jumps (durations within this process: how long
        the RM went without hearing, rm_server/app/liveness.py)."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests): `advance` is time passing while the
    process runs as usual, `pause` time passing while it is stopped (a stall), which its
    monotonic clock sees as well."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._paused = 0.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return time.monotonic() + self._paused

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def pause(self, seconds: float) -> datetime:
        """`seconds` pass with the process stopped (its monotonic clock jumps too)."""
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._paused += seconds
            return self._now


IdFactory = Callable[[str], str]


# Kinds of object made in high volume, keyed by their id in tables of millions of rows
# (ticket, ticket_history): their ids start with the time.
TIME_ORDERED_KINDS = frozenset({"t"})


def random_ids(prefix: str) -> str:
    """`t-0193f2a4c1b2…`: a prefix naming the kind of object, then 32 hex digits.

    A ticket's id is 12 hex digits of the time in milliseconds, then 20 (80 bits) random:
    tickets made later sort later, so the ticket tables grow at the right edge of their
    primary-key index (with fully random ids each insert into a table of millions of rows
    touched a random page of an index far larger than the cache, and after every
    checkpoint wrote that whole page to the WAL again). Every other id is fully random:
    operators name EngineConns and the like by a short prefix (`rmctl engineconn exec
    ec-3f2a`), which ids starting with the time would make ambiguous for everything made
    in the same quarter of an hour."""
    if prefix in TIME_ORDERED_KINDS:
        millis = time.time_ns() // 1_000_000
        return f"{prefix}-{millis & 0xFFFF_FFFF_FFFF:012x}{secrets.token_hex(10)}"
    return f"{prefix}-{secrets.token_hex(16)}"
