"""The sweeps: reclaiming LOCKED tickets past their lock timeout, dropping stale waiters
and old request ids, the retention of ended rows, and the replicas' liveness (this
replica's presence, and the removal of replicas that died).

The ticket sweep runs on the replica holding its lease; the replica check runs on every
replica (app/background.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime

from rm_server.app.background import Lease, PassObserver, run_periodically
from rm_server.app.shared import Shared
from rm_server.app.usage import Usage
from rm_server.store import replicas as replicas_store
from rm_server.store import ticket_reads
from rm_server.store import tickets as ticket_store
from rm_server.store import waiters as waiter_store

log = logging.getLogger(__name__)

PURGE_BATCH = 5000  # rows per retention DELETE: a bounded transaction
RETENTION_TABLES = ("ticket_history", "engine_conn", "demand", "ecm_event")


class Replicas:
    """This replica's presence: a row and a session advisory lock held while it lives.
    Its waiting applies count only as long as that lock is held (store/replicas.py)."""

    def __init__(self, core: Shared) -> None:
        self.core = core
        self.replica_id = ""  # set by `join`
        self._presence: replicas_store.Presence | None = None

    async def join(self) -> None:
        """Record this replica under a new id and take its session lock."""
        self.replica_id = self.core.new_id("rm")
        self._presence = await replicas_store.join(
            self.core.db.connect, self.replica_id, self.core.clock.now()
        )

    async def check(self) -> list[str]:
        """Keep this replica's presence (join again if its session was lost), then
        remove the replicas whose session ended, with their waiters; their ids."""
        await self._keep_presence()
        dead = await self.core.db.run(replicas_store.reap_dead)
        for replica_id in dead:
            log.warning("replica %s is gone: its waiting applies no longer count", replica_id)
        return dead

    async def _keep_presence(self) -> None:
        presence = self._presence
        if presence is None or await presence.alive():
            return
        log.warning("replica %s lost its database session: joining again", self.replica_id)
        with contextlib.suppress(Exception):
            await presence.session.close()
        self._presence = await replicas_store.join(
            self.core.db.connect, self.replica_id, self.core.clock.now()
        )

    async def leave(self) -> None:
        """Remove this replica's row and end its session (at shutdown)."""
        if self._presence is not None:
            await self._presence.leave()
            self._presence = None


class Sweeps:
    """The periodic passes of the core: the ticket sweep (with retention) and the
    replica check. `on_reclaimed` is told how many LOCKED tickets a sweep reclaimed
    (when any): the metrics' counter."""

    def __init__(
        self,
        core: Shared,
        replicas: Replicas,
        usage: Usage,
        on_reclaimed: Callable[[int], object] | None = None,
    ) -> None:
        self.core = core
        self.replicas = replicas
        self.usage = usage
        self.on_reclaimed = on_reclaimed
        self._tasks: list[asyncio.Task[None]] = []
        self._retention_checked_at: datetime | None = None

    def start(
        self,
        lease: Lease | None = None,
        observe: PassObserver | None = None,
        *,
        ticket_sweep: bool = True,
    ) -> None:
        """Start the ticket sweep (with a lease: only while this replica holds it; each
        pass told to `observe`; none without `ticket_sweep`) and the replica check."""
        interval = self.core.settings.sweep_interval
        if ticket_sweep:
            sweeper = run_periodically("ticket-sweep", interval, self.sweep, lease, observe)
            self._tasks.append(asyncio.create_task(sweeper, name="rm-sweeper"))
        # On every replica, no lease: each keeps its own presence, and any live one
        # finds a dead one (a dead lease holder would otherwise delay it by the lease).
        presence = run_periodically("replicas", interval, self.replicas.check, None)
        self._tasks.append(asyncio.create_task(presence, name="rm-replicas"))

    async def stop(self) -> None:
        """Cancel the passes started by `start` and wait for them to end."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def sweep(self) -> int:
        """Reclaim LOCKED tickets past their lock timeout; drop stale waiters and old
        request ids; apply the retention. Safe on several replicas: each ticket is
        reclaimed under its row locks, and one that another replica already reclaimed
        is skipped. How many tickets this pass reclaimed."""
        core = self.core
        now = core.clock.now()
        batch = core.settings.expiry_batch
        ids = await core.db.run(lambda c: ticket_reads.expired_ticket_ids(c, now, batch))
        reclaimed = 0
        for ticket_id in ids:
            done = await core.db.run(ticket_store.expire_ticket, ticket_id, now)
            if done:
                reclaimed += 1
                log.info("reclaimed ticket %s: lock not reported in time", ticket_id)
        await core.db.run(lambda c: waiter_store.purge_waiters(c, now))
        await core.db.purge_request_ids(now - core.settings.request_id_retention)
        await self._apply_retention(now)
        if reclaimed and self.on_reclaimed is not None:
            self.on_reclaimed(reclaimed)
        return reclaimed

    async def _apply_retention(self, now: datetime) -> None:
        """Delete history past its retention, a bounded batch per table per round, once
        the usage ledger has it.

        Checked every `retention_interval` seconds (at most a hundredth of the retention),
        and again at the next sweep while a table had a full batch: a busy cluster ends
        far more than a batch of tickets per interval, and the deletions must keep up."""
        settings = self.core.settings
        due = self._retention_checked_at
        interval = min(
            settings.retention_interval, settings.history_retention.total_seconds() / 100
        )
        if due is not None and (now - due).total_seconds() < interval:
            return
        # Nothing the usage ledger does not have yet (app/usage.py).
        older_than = await self.usage.history_cutoff(now - settings.history_retention)
        if older_than is None:
            return
        behind = False
        for table in RETENTION_TABLES:
            if deleted := await self.core.db.purge(table, older_than, PURGE_BATCH):
                log.info("retention: %d %s rows ended before %s", deleted, table, older_than)
                behind = behind or deleted >= PURGE_BATCH
        self._retention_checked_at = None if behind else now
