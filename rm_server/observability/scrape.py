"""A figure the collectors read from the database at scrape time: read at most every
`seconds` (however many scrapers ask), and kept as it was when a read fails, since a
scrape must still answer while the database is away."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class ScrapeCache(Generic[T]):
    """`value`: what `read()` last returned (`initial` until it first succeeds)."""

    def __init__(
        self, read: Callable[[], Awaitable[T]], initial: T, seconds: float, what: str
    ) -> None:
        self._read = read
        self.value = initial
        self.seconds = seconds
        self._what = what
        self._taken = float("-inf")

    def expire(self) -> None:
        """Read afresh at the next refresh, however recent the value."""
        self._taken = float("-inf")

    async def refresh(self) -> None:
        """Read again unless the value is recent enough."""
        if time.monotonic() - self._taken < self.seconds:
            return
        try:
            self.value = await self._read()
        except Exception:  # a scrape must still answer while the database is down
            log.warning("reading %s for metrics failed", self._what, exc_info=True)
        self._taken = time.monotonic()
