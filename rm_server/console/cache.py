"""One computation of each view per refresh period, however many browsers poll it.

Every page of the console re-reads its endpoint every two seconds. Without sharing, the
RM's work would grow with the number of open browsers (each poll a consistency check, a
list of every ticket). `ViewCache` keeps each view's result (per view, per scope: a
user sees their own) for a time to live; a poll within it is answered from memory, and
polls that arrive while the result is being computed wait for that one computation
(single flight). So the RM computes a view at most once per time to live, whatever
the number of browsers: its load is bounded by the views and scopes looked at.

`builds` and `reads` count, per view, the computations and the answers: the figures
tests and the benchmark compare (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar, cast

T = TypeVar("T")

# Entries kept at most (least recently used first out): the views times the users and
# the objects looked at recently; each entry is bounded by the list cap.
MAX_ENTRIES = 256


class ViewCache:
    """Results by (view, key), each kept `ttl` seconds from when it was computed."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_entries: int = MAX_ENTRIES
    ) -> None:
        # Monotonic seconds; replaceable so that a test can hold time still and count.
        self.clock = clock
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[Hashable, ...], tuple[float, Any]] = OrderedDict()
        self._building: dict[tuple[Hashable, ...], asyncio.Future[Any]] = {}
        self.builds: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()

    async def get(
        self, view: str, key: tuple[Hashable, ...], ttl: float, build: Callable[[], Awaitable[T]]
    ) -> T:
        """The result of `build` for (view, key): the kept one while it is fresh, else
        the one computation in flight, else a new one. A failure is not kept: every
        waiter gets it, and the next read computes again."""
        full = (view, *key)
        self.reads[view] += 1
        kept = self._entries.get(full)
        if kept is not None and self.clock() < kept[0]:
            self._entries.move_to_end(full)
            return cast(T, kept[1])
        pending = self._building.get(full)
        if pending is None:
            self.builds[view] += 1
            pending = asyncio.ensure_future(build())
            self._building[full] = pending
            pending.add_done_callback(lambda done: self._keep(full, ttl, done))
        # A browser that goes away does not cancel the computation the others wait for.
        return cast(T, await asyncio.shield(pending))

    def _keep(self, full: tuple[Hashable, ...], ttl: float, done: asyncio.Future[Any]) -> None:
        self._building.pop(full, None)
        if done.cancelled() or done.exception() is not None:
            return
        now = self.clock()
        # Expired results go at once: only what someone looked at within its time to live
        # stays in memory (a list's snapshot holds up to console_list_rows rows).
        for key in [k for k, (expires, _) in self._entries.items() if expires <= now]:
            del self._entries[key]
        self._entries[full] = (now + ttl, done.result())
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def kept(self) -> list[tuple[Hashable, ...]]:
        """The (view, key...) of every result kept now."""
        return list(self._entries)

    def forget(self, view: str) -> None:
        """Drop every kept result of `view` (after an action changed what it shows)."""
        for full in [k for k in self._entries if k[0] == view]:
            del self._entries[full]
