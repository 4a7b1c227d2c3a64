"""Usage accounting: the roll-up of ended tickets, EngineConns and demands into the
hourly ledger (a background job on the replica holding its lease; safe on several at
once, store/usage.py), and the reports read from it.

The ledger is what outlives retention: the retention sweep (app/sweeps.py) deletes no
history that ended after the last roll-up (less a margin), so a roll-up that falls
behind holds the deletions back rather than losing usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from rm_server.app.background import Lease, PassObserver, run_periodically
from rm_server.app.shared import Shared
from rm_server.domain.usage import Ledger, UsageGroup, UsageQuery
from rm_server.store import usage as usage_store

log = logging.getLogger(__name__)

# Transactions of one pass at most (each `usage_batch` rows per source: 50,000 tickets a
# pass, 5,000 a second at the default interval); a backlog is worked off over the next
# passes.
MAX_ROUNDS = 50
# History that ended this long before the last roll-up is in the ledger: no transaction
# that writes it lasts anywhere near as long (statement timeouts are seconds).
ROLL_UP_MARGIN = timedelta(hours=1)


class Usage:
    """The ledger's roll-up and reports. `on_rolled` is told what each committed
    transaction added (the metrics' counters of resource-seconds)."""

    def __init__(self, core: Shared, on_rolled: Callable[[Ledger], object] | None = None) -> None:
        self.core = core
        self.on_rolled = on_rolled
        self._task: asyncio.Task[None] | None = None

    def start(self, lease: Lease | None = None, observe: PassObserver | None = None) -> None:
        """Run the roll-up every `usage_interval` seconds (with a lease: only while this
        replica holds it)."""
        interval = self.core.settings.usage_interval
        job = run_periodically("usage-rollup", interval, self.roll_up, lease, observe)
        self._task = asyncio.create_task(job, name="rm-usage-rollup")

    async def stop(self) -> None:
        """Cancel the roll-up started by `start` and wait for it to end."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def roll_up(self) -> int:
        """Add what ended since the last roll-up to the ledger, a bounded transaction at
        a time while there is more (at most MAX_ROUNDS); how many source rows it read."""
        core = self.core
        total = 0
        for _ in range(MAX_ROUNDS):
            now = core.clock.now()
            batch = core.settings.usage_batch
            done = await core.db.run(lambda c: usage_store.roll_up(c, now, batch))  # noqa: B023
            total += sum(done.rows.values())
            if done.ledger and self.on_rolled is not None:
                self.on_rolled(done.ledger)  # committed: counted once
            if not done.behind:
                break
        return total

    async def history_cutoff(self, older_than: datetime) -> datetime | None:
        """The retention's cut-off: `older_than`, held back to what the ledger has (a
        roll-up runs first); None: delete nothing yet."""
        await self.roll_up()
        through = await self.core.db.run(usage_store.rolled_through, read_only=True)
        if through is None:
            return None
        return min(older_than, through - ROLL_UP_MARGIN)

    async def report(self, query: UsageQuery) -> list[UsageGroup]:
        """The ledger summed as `query` asks (store/usage.py, `report`)."""
        return await self.core.db.run(lambda c: usage_store.report(c, query), read_only=True)
