"""The blocked demands the planner parked, in memory: what wakes them.

A blocked demand (ALLOCATING, its allocation refused for lack of room) is parked with the
records of its labels at the refusal: while none has more room (``ledger.more_room``:
the same or less room refuses the same allocation), trying it again is useless. Each
pass reads the records of the labels parked demands wait on (one statement, a row per
label, no lock) and looks only at the demands parked since the last pass and those on a
label whose record changed: the ones with more room are woken (made due in this pass).
A pass over unchanged labels costs a row per label, whatever the demands parked on them.

Per replica: a demand parked by another replica (the planner's lease moved) or forgotten
here (a restart, the cap) is not in it; the pass counts the blocked demands parked in the
database and, when they differ, wakes the unknown ones for a full try, which parks them
here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from rm_server.domain.ledger import LabelAccount, more_room
from rm_server.store import demand_reservations as reservations
from rm_server.store import demand_rounds as rounds_store
from rm_server.store.db import Conn

Key = tuple[str, str]  # (user, demand id): demand ids are per user
MAX_BLOCKED = 100_000  # refusals remembered (a cache: forgetting costs a full try)
# Demands judged between two turns of the event loop (~0.1 ms of CPU each).
YIELD_EVERY = 100
_UNSEEN = object()


@dataclass(frozen=True)
class Refusal:
    """A blocked demand's refused allocation: the records of its labels then."""

    labels: tuple[str, ...]
    capacity: tuple[LabelAccount, ...]


@dataclass
class BlockedIndex:
    """The refusals of the parked blocked demands, by demand and by label."""

    _refused: dict[Key, Refusal] = field(default_factory=dict)
    _by_label: dict[str, set[Key]] = field(default_factory=dict)
    _seen: dict[str, LabelAccount | None] = field(default_factory=dict)
    _unchecked: set[Key] = field(default_factory=set)

    def refusal(self, key: Key) -> Refusal | None:
        return self._refused.get(key)

    def park(self, key: Key, labels: tuple[str, ...], capacity: tuple[LabelAccount, ...]) -> None:
        """Remember ``key``'s refusal; the next pass compares it with its labels."""
        if key not in self._refused and len(self._refused) >= MAX_BLOCKED:
            self.clear()  # the database still has them: the next pass wakes them all
        self.forget(key)
        self._refused[key] = Refusal(labels, capacity)
        for label in labels:
            self._by_label.setdefault(label, set()).add(key)
        self._unchecked.add(key)

    def forget(self, key: Key) -> None:
        refusal = self._refused.pop(key, None)
        self._unchecked.discard(key)
        for label in refusal.labels if refusal else ():
            keys = self._by_label.get(label)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_label[label]
                    self._seen.pop(label, None)

    def clear(self) -> None:
        self._refused.clear()
        self._by_label.clear()
        self._seen.clear()
        self._unchecked.clear()

    def __len__(self) -> int:
        return len(self._refused)

    async def wake(self, conn: Conn, at: datetime) -> list[Key]:
        """Make due at ``at`` the parked blocked demands that may fit now (more room on
        their labels than at their refusal) or that this replica does not know; those."""
        woken = await self._unknown(conn)
        labels = sorted(self._by_label)
        records = await reservations.read_capacities(conn, labels) if labels else {}
        # Rounds of other calls (a cancel) may forget demands while this one waits.
        candidates = set(self._unchecked)
        for label in labels:
            if self._seen.get(label, _UNSEEN) != records.get(label):
                candidates |= self._by_label.get(label, set())
        for n, key in enumerate(sorted(candidates)):
            if n % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # the calls waiting on the event loop go first
            refusal = self._refused.get(key)
            if refusal and more_room(
                refusal.capacity, reservations.capacity_of(records, refusal.labels)
            ):
                woken.add(key)
        self._seen = {label: records.get(label) for label in labels if label in self._by_label}
        self._unchecked.clear()
        for key in woken:
            self.forget(key)  # tried in this pass: parked again if refused again
        await rounds_store.wake(conn, sorted(woken), at)
        return sorted(woken)

    async def _unknown(self, conn: Conn) -> set[Key]:
        """The blocked demands parked in the database that are not here (those here that
        are no longer parked there are forgotten): a count, and a read when they differ."""
        if await rounds_store.blocked_count(conn) == len(self._refused):
            return set()
        parked = await rounds_store.blocked_keys(conn)
        for key in self._refused.keys() - parked:
            self.forget(key)
        return parked - self._refused.keys()
