"""Time-aware demands: the use cases behind DemandService and the background planner.

No gRPC here. Submission admits a demand against the capacity plan in one transaction;
the planner runs one round per demand per ``round_length``, each round one transaction
that claims the demand row with ``FOR UPDATE SKIP LOCKED`` (so any number of replicas can
run it), asks the pure planner what to do, and does it; the blocked demands nothing
changed for are counted together, one statement a pass (``store.demand_rounds``).
Allocation hands the demand's reserved capacity over to a ticket through the store's
Apply path (``tickets.apply``: label locks in canonical order, every label checked, all
or nothing) in the same transaction as the demand's own transition, so a crash never
leaves a ticket without its demand or a demand without its ticket.
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
from rm_server.clock import Clock
from rm_server.domain.demands import codec
from rm_server.domain.demands import planner as plan
from rm_server.domain.demands.model import (
    Demand,
    DemandSpec,
    candidate,
    not_before,
)
from rm_server.domain.demands.state import DemandState
from rm_server.domain.demands.timelang import order_ids, order_value
from rm_server.domain.ledger import LabelAccount, more_room
from rm_server.domain.model import Ticket
from rm_server.errors import (
    FailedPrecondition,
    InvalidArgument,
    LabelrmError,
    NotFound,
    ResourceExhausted,
)
from rm_server.store import demand_rounds as rounds_store
from rm_server.store import demands as store
from rm_server.store import ticket_reads
from rm_server.store import tickets as ticket_store
from rm_server.store.db import Conn, Database, Idempotency, OutcomeEncoder, Replay
from rm_server.store.notify import LabelNotifier

log = logging.getLogger(__name__)

S = DemandState
MAX_STEPS = 6  # decisions per demand per round (e.g. RESERVE, then ALLOCATE)
MAX_BLOCKED = 100_000  # refused allocations remembered (a cache: forgetting costs a retry)
# Blocked demands judged between two turns of the event loop: a pass over thousands is
# ~0.1 ms of CPU each, which in one piece holds up every call on this replica.
YIELD_EVERY = 100
Key = tuple[str, str]  # (user, demand id): demand ids are per user


@dataclass(frozen=True)
class DemandSettings:
    planner: plan.PlannerSettings = field(default_factory=plan.PlannerSettings)
    interval: float = 1.0  # seconds between background passes (real time)
    batch: int = 500  # demands per pass at most (one round, one transaction each)
    blocked_batch: int = 10_000  # unchanged blocked demands per pass at most (one UPDATE)


@dataclass(frozen=True)
class Refused:
    """A demand's refused allocation: the capacity of its labels then, and the demand as
    the planner sees it (its definition does not change: a round that passes it over
    needs only its rounds and close time from the database)."""

    capacity: tuple[LabelAccount, ...]
    view: plan.DemandView


@dataclass(frozen=True)
class Claimed:
    demand: Demand
    ticket: Ticket


@dataclass
class DemandManager:
    db: Database
    notifier: LabelNotifier
    clock: Clock
    core: RMCore
    settings: DemandSettings = field(default_factory=DemandSettings)
    _task: asyncio.Task[None] | None = None
    # Per demand, the records of its labels when its last allocation was refused: while
    # none has more room than then (others' reservations and tickets only take more), a
    # round passes the demand over without trying again (ledger.more_room: the same or
    # less room refuses the same allocation). Per replica, in memory: a miss is a full try.
    _blocked: dict[Key, Refused] = field(default_factory=dict)

    # ----- submission --------------------------------------------------------------------------

    async def submit(self, spec: DemandSpec) -> tuple[Demand, bool]:
        """Admit ``spec`` (True) or return the existing demand of the same definition (False).

        Refusals: InvalidArgument (DemandID mismatch, OrderBy cycle, id reused with another
        definition), FailedPrecondition (window closed, OrderBy on a FAILED demand),
        ResourceExhausted (no room in the plan, with the shortfalls).
        """
        c = spec.conditions
        if c.demand_id is not None and c.demand_id != spec.demand_id:
            raise InvalidArgument(
                "time_conditions",
                f"DemandID {c.demand_id} does not match demand_id {spec.demand_id}",
            )
        spec = replace(spec, conditions=replace(c, demand_id=None))
        charged = self.core.tickets.charged_keys(spec.labels)
        digest = codec.definition_hash(
            spec.user,
            [[lb.key, lb.value] for lb in spec.labels],
            spec.resource.to_dict(),
            codec.to_json(spec.conditions),
        )
        now = self.clock.now()

        async def body(conn: Conn) -> tuple[Demand, bool]:
            existing = await store.get(conn, spec.user, spec.demand_id)
            if existing is not None:
                return _same(existing, digest), False
            demand = await self._admit(conn, spec, charged, digest, now)
            if not await store.insert(conn, demand):
                existing = await store.get(conn, spec.user, spec.demand_id)
                assert existing is not None
                return _same(existing, digest), False
            demand = await store.move(
                conn,
                demand,
                S.ACCEPTED,
                _admitted(demand),
                now,
                next_check_at=now,  # its first round decides when to look again
            )
            return demand, True

        return await self.db.run(body)

    async def _admit(
        self, conn: Conn, spec: DemandSpec, charged: tuple[str, ...], digest: bytes, now: datetime
    ) -> Demand:
        order = spec.conditions.order_by
        ends: dict[str, datetime | None] = {}
        if order is not None:
            await store.lock_order_graph(conn)
            await self._refuse_cycles(conn, spec.user, spec.demand_id, order_ids(order))
            finished = await store.finished_map(conn, spec.user, order_ids(order))
            if order_value(order, finished) is False:
                failed = ", ".join(i for i, v in finished.items() if v is False)
                raise FailedPrecondition(
                    f"OrderBy can never be satisfied: {failed} FAILED",
                    state="FAILED",
                    reason="ORDER_BY_FAILED",
                )
            ends = await store.planned_ends(conn, spec.user, order_ids(order))
        await store.lock_plan(conn, charged)
        cand = candidate(spec, charged, now, not_before(order, ends))
        entries = await store.plan_entries(conn, charged, now, (spec.user, spec.demand_id))
        # A resource of the wrong type for a label: PlanError, INVALID_ARGUMENT (as_rm_error).
        placed = plan.place(cand, entries, await store.capacities(conn, charged), self.planner)
        if isinstance(placed, plan.PlanRefusal):
            if not placed.shortfalls:
                raise FailedPrecondition(
                    f"demand refused: {placed.reason}", state="NEW", reason="WINDOW_CLOSED"
                )
            raise ResourceExhausted(
                f"demand refused: {placed.reason}", placed.shortfalls, reason="DEMAND_NOT_ADMITTED"
            )
        return Demand(
            demand_id=spec.demand_id,
            state=S.NEW,
            reason="submitted",
            user=spec.user,
            labels=spec.labels,
            charged_labels=charged,
            resource=spec.resource,
            conditions=spec.conditions,
            submitted_at=now,
            planned_start=placed.start,
            plan_start=placed.plan_start,
            plan_end=placed.plan_end,
            slip=placed.slipped,
            rounds=0,
            closed_at=None,
            reserved_labels=(),
            ticket_id=None,
            allocated_at=None,
            claim_expires_at=None,
            claimed_at=None,
            ended_at=None,
            overruns=(),
            next_check_at=None,
            updated_at=now,
            definition_hash=digest,
        )

    async def _refuse_cycles(
        self, conn: Conn, user: str, demand_id: str, first: tuple[str, ...]
    ) -> None:
        """Follow OrderBy edges from the named demands (the user's own: OrderBy never
        names another user's); reaching this one is a cycle."""
        parent: dict[str, str] = {i: demand_id for i in first}
        frontier = list(first)
        while frontier:
            if demand_id in parent and demand_id in frontier:
                break
            edges = await store.order_edges(conn, user, frontier)
            frontier = []
            for source, targets in edges.items():
                for target in targets:
                    if target not in parent:
                        parent[target] = source
                        frontier.append(target)
        if demand_id not in parent:
            return
        path = [demand_id]
        node = parent[demand_id]
        while node != demand_id and len(path) < 64:
            path.append(node)
            node = parent[node]
        path.append(demand_id)
        raise InvalidArgument(
            "time_conditions",
            "OrderBy makes a cycle: " + " -> ".join(reversed(path)),
            reason="ORDER_BY_CYCLE",
        )

    @property
    def planner(self) -> plan.PlannerSettings:
        return self.settings.planner

    # ----- queries -----------------------------------------------------------------------------

    async def get(self, user: str | None, demand_id: str) -> Demand:
        """`user`'s demand (None: an operator's look-up by id alone, see `store.get`);
        another user's demand of the same id is NOT_FOUND, as if there were none."""
        d = await self.db.run(lambda c: store.get(c, user, demand_id, with_events=True))
        if d is None:
            raise NotFound(f"demand {demand_id} not found")
        return d

    async def list_demands(
        self, after: tuple[str, str], limit: int, state: str, user: str
    ) -> list[Demand]:
        return await self.db.run(lambda c: store.list_demands(c, after, limit, state, user))

    # ----- cancel and claim --------------------------------------------------------------------

    async def cancel(
        self,
        idem: Idempotency,
        user: str | None,
        demand_id: str,
        reason: str,
        encoder: OutcomeEncoder[Demand],
    ) -> Demand | Replay:
        now = self.clock.now()

        async def body(conn: Conn) -> Demand:
            d = await _locked(conn, user, demand_id)
            now = self.clock.now()  # decided once the demand is held, not before the wait
            if d.state is S.FAILED:
                return d  # cancelling twice is not an error
            if d.state is S.FINISHED:
                raise FailedPrecondition(
                    f"demand {demand_id} already FINISHED", state="FINISHED", reason="DEMAND_ENDED"
                )
            return await self._fail(conn, d, "cancelled" + (f": {reason}" if reason else ""), now)

        return await self.db.run_idempotent(idem, now, body, encoder)

    async def claim(
        self,
        idem: Idempotency,
        user: str | None,
        demand_id: str,
        encoder: OutcomeEncoder[Claimed],
    ) -> Claimed | Replay:
        now = self.clock.now()

        async def body(conn: Conn) -> Claimed:
            d = await _locked(conn, user, demand_id)
            now = self.clock.now()  # decided once the demand is held, not before the wait
            if d.state is S.ALLOCATED and d.claim_expires_at and now >= d.claim_expires_at:
                raise FailedPrecondition(
                    f"demand {demand_id} was not claimed within the claim timeout",
                    state=d.state.value,
                    reason="CLAIM_EXPIRED",
                )
            if d.state is S.ALLOCATED:
                d = await store.move(conn, d, S.MONITORING, "claimed", now, claimed_at=now)
            elif d.state is not S.MONITORING:  # MONITORING: claimed before, same answer
                raise FailedPrecondition(
                    f"demand {demand_id} is {d.state.value}: only an ALLOCATED demand is claimed",
                    state=d.state.value,
                    reason="DEMAND_NOT_ALLOCATED",
                )
            assert d.ticket_id is not None
            return Claimed(d, await ticket_reads.get_ticket(conn, d.ticket_id))

        return await self.db.run_idempotent(idem, now, body, encoder)

    # ----- the planner -------------------------------------------------------------------------

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
        """One pass: a round for every demand due (at most ``batch`` tried one by one, and
        the unchanged blocked ones); returns how many.

        The pass does the demands due by its start (give or take half a round: passes
        come one interval apart give or take the milliseconds of the lease check and the
        event loop, and a round dated one interval after the previous start must not miss
        this one by those), each once, and dates their next rounds from its start. Each
        round reads the clock itself, and each decision in it again (a pass over many
        demands takes a while): a window is judged, and a transition dated, by the time at
        which it is decided, never by the start of the pass.
        """
        start = self.clock.now()
        due = start + min(self.planner.round_length, timedelta(seconds=self.settings.interval)) / 2
        done = await self.db.run(self._pass_over_blocked, start, due)
        keys = await self.db.run(store.due_keys, due, self.settings.batch)
        for key in keys:
            done += await self.db.run(self._round, key, start, due)
        return done

    async def _pass_over_blocked(self, conn: Conn, start: datetime, due: datetime) -> int:
        """Count the round of every due blocked demand whose labels have no more room than
        when it was refused, in one statement, without locking their labels (rounds_store);
        the others (more room, any decision but another try, an OrderBy) get a round of
        their own."""
        if not self._blocked:
            return 0
        keys = list(self._blocked)
        candidates = await rounds_store.blocked_due(conn, keys, due, self.settings.blocked_batch)
        if not candidates:
            return 0
        records = await store.read_capacities(
            conn, sorted({label for row in candidates for label in row.charged_labels})
        )
        now = self.clock.now()
        todo: list[rounds_store.PassedOver] = []
        labels: set[str] = set()
        for n, row in enumerate(candidates):
            if n % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # the calls waiting on the event loop go first
            refused = self._blocked.get((row.user, row.demand_id))
            if (
                refused is None
                or refused.view.order is not None
                or more_room(refused.capacity, store.capacity_of(records, row.charged_labels))
            ):
                continue
            view = replace(refused.view, rounds=row.rounds, closed_at=row.closed_at)
            decision = plan.decide(view, now, self.planner, round_start=start)
            if decision.action is not plan.Action.ALLOCATE:
                continue
            plan_start, plan_end = plan.occupation(view, now, self.planner)
            todo.append(
                rounds_store.PassedOver(row.user, row.demand_id, row.rounds, plan_start, plan_end)
            )
            labels.update(row.charged_labels)
        if not todo:
            return 0
        await store.lock_plan(conn, sorted(labels))  # their occupations move with the time
        soon = start + self.planner.round_length
        return len(await rounds_store.pass_over(conn, todo, due, soon, now))

    async def _round(self, conn: Conn, key: Key, start: datetime, due: datetime) -> int:
        """One demand's round, if it is still due and no one else holds it: 1, else 0."""
        d = await store.claim_due(conn, key, due)
        if d is None:
            return 0
        before = d
        try:
            async with conn.transaction():  # a savepoint: an error undoes the half-done round
                d = await self._decide_and_act(conn, d, start)
        except LabelrmError as err:  # e.g. its resource no longer matches a label
            log.warning("demand %s failed: %s", before.demand_id, err.message)
            d = await self._fail(conn, before, f"planner: {err.message}", self.clock.now())
        except Exception as exc:
            if store.is_transient(exc):
                raise  # the whole transaction is retried
            # A bug must not stall every other demand: log it, look again next round.
            log.exception("planner round of demand %s failed", before.demand_id)
            now = self.clock.now()
            soon = start + self.planner.round_length
            d = await store.update(conn, before, now, next_check_at=soon)
        if d.state.active:
            now = self.clock.now()
            occupied = plan.occupation(d.view(), now, self.planner)
            if occupied != (d.plan_start, d.plan_end):
                await store.lock_plan(conn, d.charged_labels)
                d = await store.update(conn, d, now, plan_start=occupied[0], plan_end=occupied[1])
        return 1

    async def _decide_and_act(self, conn: Conn, d: Demand, start: datetime) -> Demand:
        for _ in range(MAX_STEPS):
            finished = await store.finished_map(conn, d.user, order_ids(d.conditions.order_by))
            ticket = await store.ticket_status(conn, d.ticket_id) if d.ticket_id else None
            now = self.clock.now()
            decide = partial(plan.decide, round_start=start)
            decision = decide(d.view(), now, self.planner, finished, ticket)
            if decision.action is plan.Action.ALLOCATE:
                # Take the labels first (waiting out any release under way), then decide
                # again: an allocation is judged and dated at the time it holds them,
                # never before the release that made room for it.
                capacity = await store.lock_labels(conn, d.charged_labels, now)
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
            case A.RESERVE:
                labels = await store.reserve(conn, d, now)
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
                return await self._fail(conn, d, decision.reason, now), False
            case A.EXPIRE_CLAIM:
                return await self._fail(conn, d, decision.reason, now), False
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
                    return await self._fail(
                        conn, d, decision.reason + "; ticket released", now
                    ), False
                return d, True
        raise AssertionError(f"unhandled {decision}")  # pragma: no cover

    async def _replan(self, conn: Conn, d: Demand, now: datetime) -> Demand | None:
        """Place ``d`` again from now; the demand if that moved it earlier, else None."""
        await store.lock_plan(conn, d.charged_labels)
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
        entries = await store.plan_entries(conn, d.charged_labels, now, (d.user, d.demand_id))
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
        refused = self._blocked.get(key)
        if refused is not None and not more_room(refused.capacity, capacity):
            return await store.update(conn, d, now, rounds=d.rounds + 1, next_check_at=soon)
        core = self.core
        # The ticket must outlive the claim window: LOCKED tickets are reclaimed after the
        # lock timeout, counted here from the end of the claim timeout.
        expires = now + self.planner.claim_timeout + core.settings.lock_timeout
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
        outcome = await store.allocate(conn, d, cmd)
        if isinstance(outcome, Ticket):
            self._blocked.pop(key, None)
            return await store.move(
                conn,
                d,
                S.ALLOCATED,
                f"allocated ticket {outcome.ticket_id} ({decision.reason})",
                now,
                ticket_id=outcome.ticket_id,
                allocated_at=now,
                claim_expires_at=now + self.planner.claim_timeout,
                reserved_labels=(),
                next_check_at=soon,
            )
        if len(self._blocked) >= MAX_BLOCKED:
            self._blocked.clear()
        self._blocked[key] = Refused(capacity, d.view())
        return await store.update(conn, d, now, rounds=d.rounds + 1, next_check_at=soon)

    async def _fail(self, conn: Conn, d: Demand, reason: str, now: datetime) -> Demand:
        """FAILED, returning what it holds: its reservation, or its ticket."""
        self._blocked.pop((d.user, d.demand_id), None)
        if d.state is S.ALLOCATING:
            await store.unreserve(conn, d, now)
        if d.ticket_id is not None:
            await ticket_store.release(conn, d.ticket_id, now, f"demand {d.demand_id}: {reason}")
        return await store.move(
            conn, d, S.FAILED, reason, now, ended_at=now, next_check_at=None, reserved_labels=()
        )

    async def check_reservations(self) -> list[str]:
        return await self.db.run(
            store.check_reservations, read_only=True, bound=self.db.slow_timeout
        )


async def _locked(conn: Conn, user: str | None, demand_id: str) -> Demand:
    d = await store.get(conn, user, demand_id, lock=True)
    if d is None:
        raise NotFound(f"demand {demand_id} not found")
    return d


def _same(existing: Demand, digest: bytes) -> Demand:
    if existing.definition_hash != digest:
        raise InvalidArgument(
            "demand_id",
            f"demand {existing.demand_id} exists with a different definition",
            reason="DEMAND_ID_REUSED",
        )
    return existing


def _admitted(d: Demand) -> str:
    text = f"admitted: planned start {d.planned_start:%Y-%m-%dT%H:%M:%SZ}"
    if d.slip > timedelta(0):
        text += f", {d.slip} past its window (loose)"
    return text
