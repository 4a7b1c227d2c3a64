"""The demand planner: the background passes that plan, reserve and allocate demands.

Apart from the use cases (app/demands.py, what DemandService calls) because it is a job,
not a call: run by the background loop (app/background.py) on the replica that holds its
lease, one pass per ``interval``. A pass runs one round per demand per ``round_length``,
each round one transaction that claims the demand row with ``FOR UPDATE SKIP LOCKED``
(so any number of replicas can run it), asks the pure planner (domain/demands/planner.py)
what to do, and does it. A demand that waits for something other than the time (room on
its labels, a predecessor's end) is parked until that changes (app/demand_parking.py,
store/demand_rounds.py): a pass costs what changed, not what waits.
Allocation hands the demand's reserved capacity over to a ticket through the store's
Apply path (``tickets.apply``: label locks in canonical order, every label checked, all
or nothing) in the same transaction as the demand's own transition, so a crash never
leaves a ticket without its demand or a demand without its ticket.
The transitions a use case shares with the rounds (``fail``: a cancel; ``wake_successors``)
are here too: failing a demand forgets its refusal in this replica's parked index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial

from rm_server.app.background import Lease, PassObserver, run_periodically
from rm_server.app.core import RMCore
from rm_server.app.demand_parking import BlockedIndex
from rm_server.clock import Clock
from rm_server.domain.demands import planner as plan
from rm_server.domain.demands.model import Demand
from rm_server.domain.demands.state import DemandState
from rm_server.domain.demands.timelang import order_ids
from rm_server.domain.demands.waits import finished_of
from rm_server.domain.ledger import LabelAccount, more_room
from rm_server.domain.model import Ticket
from rm_server.errors import LabelrmError
from rm_server.store import demand_reservations as reservations
from rm_server.store import demand_rounds as rounds_store
from rm_server.store import demands as store
from rm_server.store import tickets as ticket_store
from rm_server.store.db import Conn, Database

log = logging.getLogger(__name__)

S = DemandState
MAX_STEPS = 6  # decisions per demand per round (e.g. RESERVE, then ALLOCATE)
Key = tuple[str, str]  # (user, demand id): demand ids are per user


@dataclass(frozen=True)
class DemandSettings:
    planner: plan.PlannerSettings = field(default_factory=plan.PlannerSettings)
    interval: float = 1.0  # seconds between background passes (real time)
    batch: int = 500  # demands per pass at most (one round, one transaction each)


class LateAllocation(Exception):
    """An allocation whose transaction would commit after the time it is recorded at."""


@dataclass
class DemandPlanner:
    db: Database
    clock: Clock
    core: RMCore
    settings: DemandSettings = field(default_factory=DemandSettings)
    _task: asyncio.Task[None] | None = None
    # The refusals of the blocked demands parked by this replica, and what wakes them
    # (app/demand_parking.py).
    _parked: BlockedIndex = field(default_factory=BlockedIndex)

    @property
    def planner(self) -> plan.PlannerSettings:
        return self.settings.planner

    def start_background(
        self, lease: Lease | None = None, observe: PassObserver | None = None
    ) -> None:
        """Start the planner (with a lease: only while this replica holds it; each pass
        told to `observe`)."""
        planner = run_periodically(
            "demand-planner", self.settings.interval, self.tick, lease, observe
        )
        self._task = asyncio.create_task(planner, name="demand-planner")

    async def stop_background(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def tick(self) -> int:
        """One pass: a round for every demand due (at most ``batch``, one by one), the
        parked ones whose labels have more room woken first; returns how many rounds.

        The pass does the demands due by its start (give or take half a round: passes
        come one interval apart give or take the milliseconds of the lease check and the
        event loop, and a round dated one interval after the previous start must not miss
        this one by those), each once, and dates their next rounds from its start. Each
        round reads the clock itself, and each decision in it again (a pass over many
        demands takes a while): a window is judged, and a transition dated, by the time at
        which it is decided, never by the start of the pass. Parked demands get no round
        (app/demand_parking.py, store/demand_rounds.py): a pass costs what changed.
        """
        start = self.clock.now()
        due = start + min(self.planner.round_length, timedelta(seconds=self.settings.interval)) / 2
        await self.db.run(self._parked.wake, start)
        keys = await self.db.run(store.due_keys, due, self.settings.batch)
        done = 0
        for key in keys:
            d = await self.db.run(self._round, key, start, due)
            if d is not None:
                done += 1
                if d.state.terminal:  # it ended in this round
                    await self.wake_successors(d)
        return done

    async def wake_successors(self, d: Demand) -> None:
        """The demands waiting for ``d`` (their OrderBy names it, it ended): due now, in a
        transaction of its own (after d's: their rows come before any label row)."""
        await self.db.run(rounds_store.wake_successors, d.user, d.demand_id, self.clock.now())

    async def _round(self, conn: Conn, key: Key, start: datetime, due: datetime) -> Demand | None:
        """One demand's round, if it is still due and no one else holds it: the demand
        after it, else None."""
        d = await store.claim_due(conn, key, due)
        if d is None:
            return None
        if d.state.active:
            # The plan's locks before any label row (store.demands: the lock order): a
            # round may re-plan, reserve, allocate and move its occupation, in any order.
            await store.lock_plan(conn, d.charged_labels)
        if d.parked_at is not None:
            d = await self._unpark(conn, d, due)
        before = d
        soon = start + self.planner.round_length
        try:
            async with conn.transaction():  # a savepoint: an error undoes the half-done round
                d = await self._decide_and_act(conn, d, start)
                if before.allocated_at is None and d.allocated_at is not None:
                    self._committing_in_time(d.allocated_at)  # its occupation is written
        except LateAllocation as late:  # undone: allocated again in a round that is on time
            log.warning("demand %s: %s; tried again next round", before.demand_id, late)
            d = await store.update(conn, before, self.clock.now(), next_check_at=soon)
        except LabelrmError as err:  # e.g. its resource no longer matches a label
            log.warning("demand %s failed: %s", before.demand_id, err.message)
            d = await self.fail(conn, before, f"planner: {err.message}", self.clock.now())
        except Exception as exc:
            if store.is_transient(exc):
                raise  # the whole transaction is retried
            # A bug must not stall every other demand: log it, look again next round.
            log.exception("planner round of demand %s failed", before.demand_id)
            d = await store.update(conn, before, self.clock.now(), next_check_at=soon)
        return await self._occupy(conn, d)

    async def _unpark(self, conn: Conn, d: Demand, due: datetime) -> Demand:
        """A parked demand's round: its rounds passed over while parked counted (all the
        passes due since, but this one: its own round counts itself), no longer parked."""
        rounds, since = d.rounds, d.parked_at or due
        if d.state is S.ALLOCATING:
            rounds += max(plan.passes_since(since, due, self.planner.round_length) - 1, 0)
        return await store.update(conn, d, self.clock.now(), rounds=rounds, parked_at=None)

    async def _occupy(self, conn: Conn, d: Demand) -> Demand:
        """Move an active demand's occupation of the plan to where it is now (the round
        holds the plan's locks); a parked one's moves by itself (store plan_entries)."""
        if not d.state.active or d.parked_at is not None:
            return d
        now = self.clock.now()
        occupied = plan.occupation(d.view(), now, self.planner)
        if occupied == (d.plan_start, d.plan_end):
            return d
        return await store.update(conn, d, now, plan_start=occupied[0], plan_end=occupied[1])

    def _committing_in_time(self, allocated_at: datetime) -> None:
        """An allocation is recorded at the latest instant its commit may land: give it up
        (LateAllocation) unless the commit, which follows at once, has half the commit
        margin left to land by then (a pass slowed down by a busy replica or database)."""
        late = self.clock.now() - (allocated_at - self.planner.commit_margin / 2)
        if late > timedelta(0):
            raise LateAllocation(
                f"its allocation was not committing within the commit margin"
                f" ({self.planner.commit_margin}, {late} late)"
            )

    async def _decide_and_act(self, conn: Conn, d: Demand, start: datetime) -> Demand:
        for _ in range(MAX_STEPS):
            named = await store.predecessors(
                conn, d.user, order_ids(d.conditions.order_by), self.clock.now(), self.planner
            )
            finished = finished_of({i: p.state for i, p in named.items()})
            missing = {i for i, p in named.items() if p.state is None}
            ticket = await store.ticket_status(conn, d.ticket_id) if d.ticket_id else None
            now = self.clock.now()
            decide = partial(plan.decide, round_start=start, missing=missing)
            decision = decide(d.view(), now, self.planner, finished, ticket)
            if decision.action is plan.Action.ALLOCATE:
                # Take the labels first (waiting out any release under way), then decide
                # again: an allocation is judged and dated at the time it holds them,
                # never before the release that made room for it.
                capacity = await reservations.lock_labels(conn, d.charged_labels, now)
                now = self.clock.now()
                decision = decide(d.view(), now, self.planner, finished, ticket)
                if decision.action is plan.Action.ALLOCATE:
                    return await self._allocate(conn, d, decision, now, start, capacity)
            d, again = await self._act(conn, d, decision, now, start)
            if not again:
                return d
        now = self.clock.now()
        return await store.update(conn, d, now, next_check_at=start + self.planner.round_length)

    async def _act(
        self, conn: Conn, d: Demand, decision: plan.Decision, now: datetime, start: datetime
    ) -> tuple[Demand, bool]:
        """Carry out one decision; True when the planner should be asked again."""
        A = plan.Action
        soon = start + self.planner.round_length
        match decision.action:
            case A.WAIT:
                return await store.update(conn, d, now, next_check_at=decision.next_check), False
            case A.PARK:  # woken when a demand its OrderBy names ends (wake_successors)
                assert decision.next_check is not None
                return await self._park(conn, d, now, start, decision.next_check), False
            case A.RESERVE:
                labels = await reservations.reserve(conn, d, now)
                reason = f"reserving on {', '.join(labels) or 'no limited label'}"
                reason += f" ({decision.reason})"
                d = await store.move(conn, d, S.ALLOCATING, reason, now, reserved_labels=labels)
                return d, True
            case A.ALLOCATE:  # pragma: no cover - decided under the label locks, above
                raise AssertionError("an allocation is carried out by _decide_and_act")
            case A.REPLAN:
                moved = await self._replan(conn, d, now)
                if moved is None:
                    return await store.update(
                        conn, d, now, next_check_at=decision.next_check
                    ), False
                return moved, True
            case A.CLOSE:
                assert decision.closed_at is not None
                await store.note(conn, d, decision.reason, now)
                return await store.update(conn, d, now, closed_at=decision.closed_at), True
            case A.FAIL:
                return await self.fail(conn, d, decision.reason, now), False
            case A.EXPIRE_CLAIM:
                return await self.fail(conn, d, decision.reason, now), False
            case A.FINISH:
                d = await store.move(
                    conn, d, S.FINISHED, decision.reason, now, ended_at=now, next_check_at=None
                )
                return d, False
            case A.OVERRUN:
                await store.note(conn, d, decision.reason, now)
                overruns = (*d.overruns, decision.overrun)
                d = await store.update(conn, d, now, overruns=overruns, next_check_at=soon)
                log.warning("demand %s: %s", d.demand_id, decision.reason)
                if decision.enforce:
                    return await self.fail(
                        conn, d, decision.reason + "; ticket released", now
                    ), False
                return d, True
        raise AssertionError(f"unhandled {decision}")  # pragma: no cover

    async def _replan(self, conn: Conn, d: Demand, now: datetime) -> Demand | None:
        """Place ``d`` again from now (the round holds the plan's locks); the demand if that
        moved it earlier, else None."""
        view = d.view()
        cand = plan.Candidate(
            d.demand_id,
            d.charged_labels,
            d.resource,
            view.window,
            view.strategy,
            now,
            view.hold,
            user=d.user,
        )
        key = (d.user, d.demand_id)
        entries = await store.plan_entries(conn, d.charged_labels, now, key, self.planner)
        capacity = await store.capacities(conn, d.charged_labels)
        placed = plan.place(cand, entries, capacity, self.planner)
        if not isinstance(placed, plan.Placement) or placed.start >= d.planned_start:
            return None
        reason = f"re-planned: OrderBy satisfied, planned start {placed.start:%Y-%m-%dT%H:%M:%SZ}"
        await store.note(conn, d, reason, now)
        return await store.update(
            conn,
            d,
            now,
            planned_start=placed.start,
            plan_start=placed.plan_start,
            plan_end=placed.plan_end,
        )

    async def _allocate(
        self,
        conn: Conn,
        d: Demand,
        decision: plan.Decision,
        now: datetime,
        start: datetime,
        capacity: tuple[LabelAccount, ...],
    ) -> Demand:
        """Allocate under the label locks (``capacity``: what they hold), or pass it over."""
        soon = start + self.planner.round_length
        key = (d.user, d.demand_id)
        refused = self._parked.refusal(key)
        if refused is not None and not more_room(refused.capacity, capacity):
            return await self._park_blocked(conn, d, now, start, refused.capacity)
        core = self.core
        # Recorded as allocated when it becomes visible: by its commit, at the latest the
        # decision plus the commit margin (decide() checked the window holds then too).
        at = now + self.planner.commit_margin
        # The ticket must outlive the claim window: LOCKED tickets are reclaimed after the
        # lock timeout, counted here from the end of the claim timeout.
        expires = at + self.planner.claim_timeout + core.settings.lock_timeout
        cmd = ticket_store.ApplyCommand(
            ticket_id=core.new_id("t"),
            user=d.user,
            labels=d.labels,
            keys=d.charged_labels,
            resource=d.resource,
            now=now,
            lock_expires_at=expires,
            # Rank ahead of every queued apply (their sequence numbers start at 1): this
            # capacity was promised by the plan. apply() then deletes waiter 0: a no-op.
            waiter_seq=0,
        )
        outcome = await reservations.allocate(conn, d, cmd)
        if isinstance(outcome, Ticket):
            self._parked.forget(key)
            d = replace(d, allocated_at=at)  # its occupation from then, in the same UPDATE
            plan_start, plan_end = plan.occupation(d.view(), at, self.planner)
            return await store.move(
                conn,
                d,
                S.ALLOCATED,
                f"allocated ticket {outcome.ticket_id} ({decision.reason})",
                at,
                ticket_id=outcome.ticket_id,
                allocated_at=at,
                claim_expires_at=at + self.planner.claim_timeout,
                reserved_labels=(),
                next_check_at=soon,
                plan_start=plan_start,
                plan_end=plan_end,
            )
        return await self._park_blocked(conn, d, now, start, capacity)

    async def _park_blocked(
        self,
        conn: Conn,
        d: Demand,
        now: datetime,
        start: datetime,
        capacity: tuple[LabelAccount, ...],
    ) -> Demand:
        """Passed over (its round counted) and parked until its labels have more room than
        ``capacity`` (what refused it) or its window's next instant comes."""
        d = replace(d, rounds=d.rounds + 1)
        until = plan.park_until(d.view(), now, start, self.planner)
        self._parked.park((d.user, d.demand_id), d.charged_labels, capacity)
        return await self._park(conn, d, now, start, until)

    async def _park(
        self, conn: Conn, d: Demand, now: datetime, start: datetime, until: datetime
    ) -> Demand:
        default = self.planner.default_duration
        return await rounds_store.park(conn, d, now, start, until, default)

    async def fail(self, conn: Conn, d: Demand, reason: str, now: datetime) -> Demand:
        """FAILED, returning what it holds: its reservation, or its ticket."""
        self._parked.forget((d.user, d.demand_id))
        if d.state is S.ALLOCATING:
            await reservations.unreserve(conn, d, now)
        if d.ticket_id is not None:
            await ticket_store.release(conn, d.ticket_id, now, f"demand {d.demand_id}: {reason}")
        return await store.move(
            conn,
            d,
            S.FAILED,
            reason,
            now,
            ended_at=now,
            next_check_at=None,
            reserved_labels=(),
            parked_at=None,
        )
