"""The RM's use cases, between the gRPC servicers and the store.

No gRPC and no SQL here: requests arrive as domain values, the store runs each
operation in one transaction, and results leave as domain values (or as the
stored outcome of an earlier call with the same request id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rm_server.app.batching import Combiner, each_alone_on_failure
from rm_server.background import Lease, run_periodically
from rm_server.clock import Clock, IdFactory, SystemClock, random_ids
from rm_server.domain.external import QueueCheck
from rm_server.domain.labels import (
    DEFAULT_RULES,
    EM_INSTANCE,
    USER_CREATOR,
    Label,
    TransformRule,
    transform,
)
from rm_server.domain.ledger import blocked_by_own_quota
from rm_server.domain.limits import LabelPattern
from rm_server.domain.model import (
    ConsistencyReport,
    LabelResource,
    Registration,
    StoredLimit,
    Ticket,
)
from rm_server.domain.resources import Resource
from rm_server.errors import DeadlineExceeded, InvalidArgument, Unavailable
from rm_server.external import ExternalResources
from rm_server.store import admin as admin_store
from rm_server.store import owners
from rm_server.store import providers as provider_store
from rm_server.store import replicas as replicas_store
from rm_server.store import tickets as ticket_store
from rm_server.store import waiters as waiter_store
from rm_server.store.db import Database, Idempotency, OutcomeEncoder, Replay
from rm_server.store.notify import LabelNotifier

log = logging.getLogger(__name__)

AfterApply = ticket_store.AfterApply


PURGE_BATCH = 5000  # rows per retention DELETE: a bounded transaction


@dataclass(frozen=True)
class CoreSettings:
    lock_timeout: timedelta = timedelta(minutes=10)
    request_id_retention: timedelta = timedelta(hours=48)
    # Ended tickets (ticket_history), EngineConns and demands are kept this long, then
    # deleted by the sweep (checked every `retention_interval` seconds).
    history_retention: timedelta = timedelta(days=30)
    retention_interval: float = 60.0
    sweep_interval: float = 1.0
    rules: tuple[TransformRule, ...] = DEFAULT_RULES
    expiry_batch: int = 200
    # Concurrent Apply / ReportUsed / Release share transactions (rm_server/app/batching.py):
    # at most `batch_max` requests per transaction (0: one transaction per request, the
    # classic path), at most `batch_inflight` such transactions at a time per process.
    batch_max: int = 256
    batch_inflight: int = 1
    # Only ECMs the node include list names may register (none while it is empty).
    node_include_required: bool = False
    # Agent heartbeats (rm_server/app/agents.py) are grouped the same way, each group leaving
    # at most `heartbeat_linger` seconds after its first beat.
    heartbeat_linger: float = 0.005
    # A waiting Apply holds capacity back from later requests for at most this long
    # (docs/architecture.md, "Waiting applies and fairness").
    waiter_hold: timedelta = timedelta(seconds=30)


@dataclass
class RMCore:
    db: Database
    notifier: LabelNotifier
    settings: CoreSettings = field(default_factory=CoreSettings)
    clock: Clock = field(default_factory=SystemClock)
    new_id: IdFactory = random_ids
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _combiner: Combiner[ticket_store.Op] | None = None
    _retention_checked_at: datetime | None = None
    _keys_cache: dict[tuple[Label, ...], tuple[str, ...]] = field(default_factory=dict)
    _keys_rules: tuple[TransformRule, ...] | None = None
    # External resources (YARN queues); None: requests are admitted on labelrm's records only.
    external: ExternalResources | None = None
    _queue_records: set[str] = field(default_factory=set)  # external queue records made
    _presence: replicas_store.Presence | None = None
    replica_id: str = ""
    # Told how many LOCKED tickets each sweep reclaimed (when any): the metrics' counter.
    on_reclaimed: Callable[[int], object] | None = None

    async def check_replicas(self) -> list[str]:
        """Keep this replica's presence (join again if its session was lost), then
        remove the replicas whose session ended, with their waiters; their ids."""
        await self._keep_presence()
        dead = await self.db.run(replicas_store.reap_dead)
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
            self.db.conninfo, self.replica_id, self.clock.now()
        )

    async def join_replicas(self) -> None:
        """Record this replica, holding its session advisory lock while it lives: its
        waiting applies count only as long as that lock is held."""
        self.replica_id = self.new_id("rm")
        self._presence = await replicas_store.join(
            self.db.conninfo, self.replica_id, self.clock.now()
        )

    # ----- background work ---------------------------------------------------------------

    def start_background(self, lease: Lease | None = None) -> None:
        """Start the ticket sweep (with a lease: only while this replica holds it)."""
        # A lambda, not the bound method: metrics wrap `self.sweep` after construction.
        sweeper = run_periodically(
            "ticket-sweep", self.settings.sweep_interval, lambda: self.sweep(), lease
        )
        self._tasks.append(asyncio.create_task(sweeper, name="rm-sweeper"))
        # On every replica, no lease: each keeps its own presence, and any live one
        # finds a dead one (a dead lease holder would otherwise delay it by the lease).
        presence = run_periodically(
            "replicas", self.settings.sweep_interval, self.check_replicas, None
        )
        self._tasks.append(asyncio.create_task(presence, name="rm-replicas"))

    async def stop_background(self) -> None:
        if self._combiner is not None:
            await self._combiner.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._presence is not None:
            await self._presence.leave()
            self._presence = None

    async def sweep(self) -> int:
        """Reclaim LOCKED tickets past their lock timeout; drop stale waiters and old
        request ids. Safe on several replicas: each ticket is reclaimed under its row
        locks, and one that another replica already reclaimed is skipped."""
        now = self.clock.now()
        ids = await self.db.run(
            lambda c: ticket_store.expired_ticket_ids(c, now, self.settings.expiry_batch)
        )
        reclaimed = 0
        for ticket_id in ids:
            done = await self.db.run(ticket_store.expire_ticket, ticket_id, now)
            if done:
                reclaimed += 1
                log.info("reclaimed ticket %s: lock not reported in time", ticket_id)
        await self.db.run(lambda c: waiter_store.purge_waiters(c, now))
        await self.db.purge_request_ids(now - self.settings.request_id_retention)
        await self._apply_retention(now)
        if reclaimed and self.on_reclaimed is not None:
            self.on_reclaimed(reclaimed)
        return reclaimed

    async def _apply_retention(self, now: datetime) -> None:
        """Delete history past its retention, a bounded batch per table per round.

        Checked every `retention_interval` seconds (at most a hundredth of the retention),
        and again at the next sweep while a table had a full batch: a busy cluster ends
        far more than a batch of tickets per interval, and the deletions must keep up."""
        due = self._retention_checked_at
        interval = min(
            self.settings.retention_interval,
            self.settings.history_retention.total_seconds() / 100,
        )
        if due is not None and (now - due).total_seconds() < interval:
            return
        older_than = now - self.settings.history_retention
        behind = False
        for table in ("ticket_history", "engine_conn", "demand"):
            if deleted := await self.db.purge(table, older_than, PURGE_BATCH):
                log.info("retention: %d %s rows ended before %s", deleted, table, older_than)
                behind = behind or deleted >= PURGE_BATCH
        self._retention_checked_at = None if behind else now

    # ----- resource usage ----------------------------------------------------------------

    def charged_keys(self, labels: tuple[Label, ...]) -> tuple[str, ...]:
        cache = self._keys_cache
        if self._keys_rules is not self.settings.rules:
            cache.clear()
            self._keys_rules = self.settings.rules
        keys = cache.get(labels)
        if keys is None:  # the same label sets come back again and again: computed once
            if len(cache) >= 65536:
                cache.clear()
            keys = cache[labels] = tuple(str(k) for k in transform(labels, self.settings.rules))
        return keys

    async def apply(
        self,
        idem: Idempotency,
        user: str,
        labels: tuple[Label, ...],
        resource: Resource,
        wait_seconds: float,
        encoder: OutcomeEncoder[Ticket],
        after: AfterApply | None = None,
        engine_conn_id: str = "",
    ) -> Ticket | Replay:
        """Lock `resource` on every resource-carrying label, or wait for it (FIFO).

        `after`, if given, runs in the same transaction once the ticket is charged
        (the EngineConn flow queues its launch command there, atomically)."""
        keys = self.charged_keys(labels)
        ticket_id = self.new_id("t")
        queue, resource = await self._external(labels, resource)
        if queue is not None:
            keys = tuple(sorted((*keys, queue.label)))

        def attempt(waiter: int | None, may_wait: bool) -> Awaitable[Ticket | Replay]:
            # One call for both paths (`queue` and `resource` as they are at the try).
            return self._apply_once(
                idem,
                encoder,
                ticket_id,
                user,
                labels,
                keys,
                resource,
                waiter,
                may_wait=may_wait,
                after=after,
                engine_conn_id=engine_conn_id,
                queue=queue,
            )

        if wait_seconds <= 0:
            return await attempt(None, may_wait=False)
        deadline = time.monotonic() + wait_seconds
        waiter: int | None = None
        # How long this waiter may hold capacity back from later requests; it holds
        # nothing while it is over its own quota (no other user's release can help).
        hold_ends = self.clock.now() + self.settings.waiter_hold
        holding = True
        with self.notifier.subscribe(keys) as freed:
            try:
                while True:
                    freed.clear()
                    if queue is not None:  # the queue's live figures, fresh for each try
                        queue, resource = await self._external(labels, resource)
                    try:
                        return await attempt(waiter, may_wait=True)
                    except ticket_store.MustWait as wait:
                        refusal = wait.refusal
                    except Unavailable:
                        # The database went away while this apply waits (a failover): it
                        # goes on waiting within its deadline, and its next try reaches the
                        # new primary (its waiter row went there with the commit).
                        if deadline - time.monotonic() <= 0:
                            raise
                        await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeadlineExceeded(
                            f"no capacity within {wait_seconds:g}s", refusal.shortfalls
                        )
                    wanted = not blocked_by_own_quota(refusal)
                    if waiter is None:
                        # Join the queue, then try again before sleeping: a release that
                        # happened before we subscribed must not be missed.
                        holding = wanted
                        waiter = await self._join_queue(
                            ticket_id,
                            keys,
                            remaining,
                            _owner(user, labels),
                            resource,
                            hold_ends if holding else self.clock.now(),
                        )
                        continue
                    if wanted != holding:
                        # Unavailable: the hold is set again at the next round.
                        with contextlib.suppress(Unavailable):
                            await self._set_hold(waiter, hold_ends if wanted else self.clock.now())
                            holding = wanted
                    # Also look again when holds may have lapsed (no release wakes us then).
                    nap = min(remaining, max(1.0, self.settings.waiter_hold.total_seconds() / 4))
                    if queue is not None:
                        # YARN tells nobody when its applications end: look again when the
                        # cached figures are due, even without a release here.
                        nap = min(nap, self._external_recheck(queue))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(freed.wait(), timeout=nap)
            except BaseException:
                if waiter is not None:
                    seq = waiter
                    await asyncio.shield(self.db.run(lambda c: waiter_store.remove_waiter(c, seq)))
                raise

    async def _join_queue(
        self,
        waiter_id: str,
        keys: tuple[str, ...],
        wait: float,
        user: str = "",
        resource: Resource | None = None,
        hold_until: datetime | None = None,
    ) -> int:
        """Queue a waiting apply: it holds `resource` back until `hold_until`."""
        # A crashed replica's rows stop counting when the sweep finds its lock free
        # (store/replicas.py); the deadline (+ slack) is the backstop.
        now = self.clock.now()
        entry = waiter_store.WaiterEntry(
            waiter_id,
            keys,
            now + timedelta(seconds=wait + 5),
            user,
            resource,
            self.replica_id,
            hold_until,
        )
        return await self.db.run(lambda c: waiter_store.register_waiter(c, entry))

    async def _set_hold(self, seq: int, hold_until: datetime) -> None:
        await self.db.run(lambda c: waiter_store.set_waiter_hold(c, seq, hold_until))

    async def _apply_once(
        self,
        idem: Idempotency,
        encoder: OutcomeEncoder[Ticket],
        ticket_id: str,
        user: str,
        labels: tuple[Label, ...],
        keys: tuple[str, ...],
        resource: Resource,
        waiter: int | None,
        *,
        may_wait: bool = False,
        after: AfterApply | None = None,
        engine_conn_id: str = "",
        queue: QueueCheck | None = None,
    ) -> Ticket | Replay:
        op = ticket_store.ApplyOp(
            idem,
            encoder,
            ticket_id,
            user,
            labels,
            keys,
            resource,
            self.settings.lock_timeout,
            waiter,
            may_wait,
            after,
            engine_conn_id,
            queue,
        )
        while True:
            try:
                return await self._submit(op)
            except ticket_store.NeedLimitRows as need:
                now = self.clock.now()
                await self.db.run(admin_store.ensure_limit_rows, need.labels, now)

    async def _external(
        self, labels: tuple[Label, ...], resource: Resource
    ) -> tuple[QueueCheck | None, Resource]:
        """The external queue the request must also fit (with the request naming the queue's
        full path), fetched before any transaction: an unreachable YARN charges nothing."""
        if self.external is None:
            return None, resource
        found = await self.external.admission(labels, resource)
        if found is None:
            return None, resource
        queue, resource = found
        if queue.label not in self._queue_records:  # its record, before its first Apply
            now = self.clock.now()
            await self.db.run(lambda c: provider_store.ensure_queue_row(c, queue.label, now))
            self._queue_records.add(queue.label)
        return queue, resource

    def _external_recheck(self, queue: QueueCheck) -> float:
        """Seconds until a waiting apply on `queue` should look at YARN's figures again."""
        assert self.external is not None
        return self.external.recheck_after(queue)

    async def report_used(
        self,
        idem: Idempotency,
        ticket_id: str,
        used: Resource | None,
        encoder: OutcomeEncoder[Ticket],
    ) -> Ticket | Replay:
        """A user's ReportUsed (refused on a ticket an EngineConn owns)."""
        op = ticket_store.ReportOp(idem, encoder, ticket_id, used, from_user=True)
        return await self._submit(op)

    async def release(
        self, idem: Idempotency, ticket_id: str, encoder: OutcomeEncoder[Ticket]
    ) -> Ticket | Replay:
        """A user's Release (refused on a ticket an EngineConn owns)."""
        op = ticket_store.ReleaseOp(idem, encoder, ticket_id, from_user=True)
        return await self._submit(op)

    async def _submit(self, op: ticket_store.Op) -> Ticket | Replay:
        """Run `op` in the next group (grouping on), or in a group of its own."""
        combiner = self._grouping()
        if combiner is not None:
            outcome: Ticket | Replay = await combiner.submit(op)
            return outcome
        (alone,) = await self._run_group([op])
        if isinstance(alone, BaseException):
            raise alone
        assert alone is not None  # only expiry answers None
        return alone

    def _grouping(self) -> Combiner[ticket_store.Op] | None:
        """The request combiner, or None when grouping is off (CoreSettings.batch_max)."""
        if self.settings.batch_max <= 0:
            return None
        if self._combiner is None:
            self._combiner = Combiner(
                self._run_group,
                max_batch=self.settings.batch_max,
                max_inflight=self.settings.batch_inflight,
            )
        return self._combiner

    async def _run_group(self, ops: Sequence[ticket_store.Op]) -> list[ticket_store.Outcome]:
        """One transaction for `ops` (each alone should the group fail as a whole)."""
        return await each_alone_on_failure(self._group_transaction, ops, "requests")

    async def _group_transaction(
        self, ops: Sequence[ticket_store.Op]
    ) -> list[ticket_store.Outcome]:
        now = self.clock.now()
        return await self.db.run(
            lambda c: ticket_store.run(c, ops, now), pipeline=True, retry_unique=True
        )

    async def get_ticket(self, ticket_id: str) -> Ticket:
        return await self.db.run(lambda c: ticket_store.get_ticket(c, ticket_id))

    async def list_user_tickets(
        self, user: str, after: str, limit: int, label: str, state: str
    ) -> list[Ticket]:
        """`list_tickets` restricted to the tickets of one user."""
        return await self.db.run(
            owners.list_user_tickets, user, after, limit, label, state, read_only=True
        )

    async def list_tickets(self, after: str, limit: int, label: str, state: str) -> list[Ticket]:
        return await self.db.run(lambda c: ticket_store.list_tickets(c, after, limit, label, state))

    async def get_label_resource(self, label: str) -> LabelResource:
        return await self.db.run(lambda c: admin_store.get_label_resource(c, label))

    async def list_label_resources(
        self, after: str, limit: int, source: str
    ) -> list[LabelResource]:
        return await self.db.run(
            lambda c: admin_store.list_label_resources(c, after, limit, source)
        )

    # ----- ECMs ----------------------------------------------------------------------------

    async def register_ecm(
        self,
        idem: Idempotency,
        instance: str,
        labels: tuple[Label, ...],
        total: Resource,
        protected: Resource,
        encoder: OutcomeEncoder[Registration],
    ) -> Registration | Replay:
        own = Label(EM_INSTANCE, instance)
        others = tuple(lb for lb in labels if lb.key != EM_INSTANCE)
        if any(lb.key == EM_INSTANCE and lb != own for lb in labels):
            raise InvalidArgument("labels", f"emInstance must equal the instance {instance!r}")
        if not total.ge(protected):
            raise InvalidArgument("protected_resource", "must not exceed total_resource")
        all_labels = (own, *others)
        now = self.clock.now()
        return await self.db.run_idempotent(
            idem,
            now,
            lambda c: admin_store.register_ecm(
                c,
                instance,
                str(own),
                all_labels,
                total,
                protected,
                now,
                self.settings.node_include_required,
            ),
            encoder,
        )

    async def unregister_ecm(
        self, idem: Idempotency, instance: str, encoder: OutcomeEncoder[list[str]]
    ) -> list[str] | Replay:
        now = self.clock.now()
        return await self.db.run_idempotent(
            idem, now, lambda c: admin_store.unregister_ecm(c, instance, now), encoder
        )

    # ----- limits and checks --------------------------------------------------------------

    async def set_limit(
        self,
        idem: Idempotency,
        pattern: LabelPattern,
        max_resource: Resource,
        encoder: OutcomeEncoder[tuple[StoredLimit, int]],
    ) -> tuple[StoredLimit, int] | Replay:
        now = self.clock.now()
        return await self.db.run_idempotent(
            idem, now, lambda c: admin_store.set_limit(c, pattern, max_resource, now), encoder
        )

    async def delete_limit(
        self, idem: Idempotency, pattern: LabelPattern, encoder: OutcomeEncoder[int]
    ) -> int | Replay:
        now = self.clock.now()
        return await self.db.run_idempotent(
            idem, now, lambda c: admin_store.delete_limit(c, pattern, now), encoder
        )

    async def list_limits(self, after: str, limit: int) -> list[StoredLimit]:
        return await self.db.run(lambda c: admin_store.list_limits(c, after, limit))

    async def check_consistency(self) -> ConsistencyReport:
        return await self.db.run(admin_store.check_consistency, read_only=True)


def _owner(user: str, labels: tuple[Label, ...]) -> str:
    """Whose waiter this is, for "one hold per user": the caller, else the user part
    of its userCreator label."""
    if user:
        return user
    creator = next((lb.value for lb in labels if lb.key == USER_CREATOR), "")
    return creator.split("-", 1)[0]
