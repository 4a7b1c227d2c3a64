"""Tickets: Apply (at once, or waiting in line for capacity), ReportUsed and Release,
and the reads of tickets.

Concurrent requests share transactions (app/batching.py, `CoreSettings.batch_max`); a
waiting Apply queues on every record it charges and tries again when one of them frees
capacity (docs/architecture.md, "Waiting applies and fairness").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from rm_server.app.batching import Combiner, each_alone_on_failure
from rm_server.app.shared import Shared
from rm_server.domain.external import QueueCheck
from rm_server.domain.labels import USER_CREATOR, Label, TransformRule, transform
from rm_server.domain.ledger import blocked_by_own_quota
from rm_server.domain.model import Ticket
from rm_server.domain.resources import Resource
from rm_server.errors import DeadlineExceeded, Unavailable
from rm_server.store import admin as admin_store
from rm_server.store import providers as provider_store
from rm_server.store import ticket_ops, ticket_reads
from rm_server.store import tickets as ticket_store
from rm_server.store import waiters as waiter_store
from rm_server.store.db import Conn, Idempotency, OutcomeEncoder, Replay

AfterApply = ticket_ops.AfterApply

KEYS_CACHE_SIZE = 65536  # label sets whose charged records are remembered


class Tickets:
    """Apply, ReportUsed and Release of tickets, and the reads of tickets."""

    def __init__(self, core: Shared) -> None:
        self.core = core
        self._combiner: Combiner[ticket_ops.Op] | None = None
        self._keys_cache: dict[tuple[Label, ...], tuple[str, ...]] = {}
        self._keys_rules: tuple[TransformRule, ...] | None = None
        self._queue_records: set[str] = set()  # external queue records made

    async def close(self, grace: float | None = None) -> None:
        """Let the requests grouped so far finish (at shutdown); past `grace` seconds,
        cancel them (Combiner.close)."""
        if self._combiner is not None:
            await self._combiner.close(grace)

    def charged_keys(self, labels: tuple[Label, ...]) -> tuple[str, ...]:
        """The label records a request with `labels` charges (the label rules applied)."""
        rules = self.core.settings.rules
        cache = self._keys_cache
        if self._keys_rules is not rules:
            cache.clear()
            self._keys_rules = rules
        keys = cache.get(labels)
        if keys is None:  # the same label sets come back again and again: computed once
            if len(cache) >= KEYS_CACHE_SIZE:
                cache.clear()
            keys = cache[labels] = tuple(str(k) for k in transform(labels, rules))
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
        core = self.core
        keys = self.charged_keys(labels)
        ticket_id = core.new_id("t")
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
        hold_ends = core.clock.now() + core.settings.waiter_hold
        holding = True
        with core.notifier.subscribe(keys) as freed:
            try:
                while True:
                    freed.clear()
                    if queue is not None:  # the queue's live figures, fresh for each try
                        queue, resource = await self._external(labels, resource)
                    try:
                        return await attempt(waiter, may_wait=True)
                    except ticket_ops.MustWait as wait:
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
                            hold_ends if holding else core.clock.now(),
                        )
                        continue
                    if wanted != holding:
                        # Unavailable: the hold is set again at the next round.
                        with contextlib.suppress(Unavailable):
                            await self._set_hold(waiter, hold_ends if wanted else core.clock.now())
                            holding = wanted
                    # Also look again when holds may have lapsed (no release wakes us then).
                    nap = min(remaining, max(1.0, core.settings.waiter_hold.total_seconds() / 4))
                    if queue is not None:
                        # YARN tells nobody when its applications end: look again when the
                        # cached figures are due, even without a release here.
                        nap = min(nap, self._external_recheck(queue))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(freed.wait(), timeout=nap)
            except BaseException:
                if waiter is not None:
                    seq = waiter
                    await asyncio.shield(core.db.run(lambda c: waiter_store.remove_waiter(c, seq)))
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
        now = self.core.clock.now()
        entry = waiter_store.WaiterEntry(
            waiter_id,
            keys,
            now + timedelta(seconds=wait + 5),
            user,
            resource,
            self.core.replica_id,
            hold_until,
        )
        return await self.core.db.run(lambda c: waiter_store.register_waiter(c, entry))

    async def _set_hold(self, seq: int, hold_until: datetime) -> None:
        await self.core.db.run(lambda c: waiter_store.set_waiter_hold(c, seq, hold_until))

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
        op = ticket_ops.ApplyOp(
            idem,
            encoder,
            ticket_id,
            user,
            labels,
            keys,
            resource,
            self.core.settings.lock_timeout,
            waiter,
            may_wait,
            after,
            engine_conn_id,
            queue,
        )
        while True:
            try:
                return await self._submit(op)
            except ticket_ops.NeedLimitRows as need:
                now = self.core.clock.now()
                await self.core.db.run(admin_store.ensure_limit_rows, need.labels, now)

    async def _external(
        self, labels: tuple[Label, ...], resource: Resource
    ) -> tuple[QueueCheck | None, Resource]:
        """The external queue the request must also fit (with the request naming the queue's
        full path), fetched before any transaction: an unreachable YARN charges nothing."""
        external = self.core.external
        if external is None:
            return None, resource
        found = await external.admission(labels, resource)
        if found is None:
            return None, resource
        queue, resource = found
        if queue.label not in self._queue_records:  # its record, before its first Apply
            now = self.core.clock.now()
            await self.core.db.run(lambda c: provider_store.ensure_queue_row(c, queue.label, now))
            self._queue_records.add(queue.label)
        return queue, resource

    def _external_recheck(self, queue: QueueCheck) -> float:
        """Seconds until a waiting apply on `queue` should look at YARN's figures again."""
        assert self.core.external is not None
        return self.core.external.recheck_after(queue)

    async def report_used(
        self,
        idem: Idempotency,
        ticket_id: str,
        used: Resource | None,
        encoder: OutcomeEncoder[Ticket],
    ) -> Ticket | Replay:
        """A user's ReportUsed (refused on a ticket an EngineConn owns)."""
        op = ticket_ops.ReportOp(idem, encoder, ticket_id, used, from_user=True)
        return await self._submit(op)

    async def release(
        self, idem: Idempotency, ticket_id: str, encoder: OutcomeEncoder[Ticket]
    ) -> Ticket | Replay:
        """A user's Release (refused on a ticket an EngineConn owns)."""
        op = ticket_ops.ReleaseOp(idem, encoder, ticket_id, from_user=True)
        return await self._submit(op)

    async def _submit(self, op: ticket_ops.Op) -> Ticket | Replay:
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

    def _grouping(self) -> Combiner[ticket_ops.Op] | None:
        """The request combiner, or None when grouping is off (CoreSettings.batch_max)."""
        settings = self.core.settings
        if settings.batch_max <= 0:
            return None
        if self._combiner is None:
            self._combiner = Combiner(
                self._run_group,
                max_batch=settings.batch_max,
                max_inflight=settings.batch_inflight,
            )
        return self._combiner

    async def _run_group(self, ops: Sequence[ticket_ops.Op]) -> list[ticket_store.Outcome]:
        """One transaction for `ops` (each alone should the group fail as a whole)."""
        return await each_alone_on_failure(self._group_transaction, ops, "requests")

    async def _group_transaction(self, ops: Sequence[ticket_ops.Op]) -> list[ticket_store.Outcome]:
        now = self.core.clock.now()
        return await self.core.db.run(
            lambda c: ticket_store.run(c, ops, now), pipeline=True, retry_unique=True
        )

    async def get_ticket(self, ticket_id: str) -> Ticket:
        """One ticket, live or ended (NotFound otherwise); an EngineConn's with what its
        agent measured."""

        async def body(conn: Conn) -> Ticket:
            ticket = await ticket_reads.get_ticket(conn, ticket_id)
            measured = await ticket_reads.measured_of(conn, ticket)
            return ticket if measured is None else replace(ticket, measured=measured)

        return await self.core.db.run(body)

    async def list_tickets(
        self, after: str, limit: int, label: str, state: str, user: str | None = None
    ) -> list[Ticket]:
        """A page of tickets after ticket id `after`, filtered by label and state; with
        `user`, only that user's (an empty name: none)."""
        return await self.core.db.run(
            lambda c: ticket_reads.list_tickets(c, after, limit, label, state, user)
        )


def _owner(user: str, labels: tuple[Label, ...]) -> str:
    """Whose waiter this is, for "one hold per user": the caller, else the user part
    of its userCreator label."""
    if user:
        return user
    creator = next((lb.value for lb in labels if lb.key == USER_CREATOR), "")
    return creator.split("-", 1)[0]
