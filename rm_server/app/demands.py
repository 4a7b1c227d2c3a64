"""Time-aware demands: the use cases behind DemandService.

No gRPC here, and no planner: submission, the queries, cancel and claim, each one call
in its own transaction. Submission admits a demand against the capacity plan in one
transaction (app/demand_admission.py) and leaves it ACCEPTED, due for its first round;
the rounds that reserve and allocate it are the planner's (app/demand_planner.py, a
background job), apart because they run on their own, not on a caller's behalf.
``DemandManager.planning`` is that planner: a cancel fails the demand through it (its
reservation or ticket returned, its refusal forgotten in the parked index) and wakes
the demands whose OrderBy names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rm_server.app.core import RMCore
from rm_server.app.demand_admission import admit, admitted, same_definition
from rm_server.app.demand_planner import DemandPlanner, DemandSettings
from rm_server.clock import Clock
from rm_server.domain.demands import codec
from rm_server.domain.demands import planner as plan
from rm_server.domain.demands.model import (
    Demand,
    DemandSpec,
    as_of,
    order_wait_keys,
    with_order_wait,
)
from rm_server.domain.demands.state import DemandState
from rm_server.domain.model import Ticket
from rm_server.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from rm_server.store import demand_reservations as reservations
from rm_server.store import demands as store
from rm_server.store import ticket_reads
from rm_server.store.db import Conn, Database, Idempotency, OutcomeEncoder, Replay
from rm_server.store.notify import LabelNotifier

S = DemandState


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
    # The planner of these demands (app/demand_planner.py): started by the server's
    # background jobs; a cancel fails a demand through it.
    planning: DemandPlanner = field(init=False)

    def __post_init__(self) -> None:
        self.planning = DemandPlanner(self.db, self.clock, self.core, self.settings)

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
                return as_of(same_definition(existing, digest), now, self.planner), False
            demand = await admit(conn, spec, charged, digest, now, self.planner)
            if not await store.insert(conn, demand):
                existing = await store.get(conn, spec.user, spec.demand_id)
                assert existing is not None
                return same_definition(existing, digest), False
            demand = await store.move(
                conn,
                demand,
                S.ACCEPTED,
                admitted(demand),
                now,
                next_check_at=now,  # its first round decides when to look again
            )
            return demand, True

        return await self.db.run(body)

    @property
    def planner(self) -> plan.PlannerSettings:
        return self.settings.planner

    # ----- queries -----------------------------------------------------------------------------

    async def get(self, user: str | None, demand_id: str) -> Demand:
        """`user`'s demand (None: an operator's look-up by id alone, see `store.get`), with
        its history and what its OrderBy waits for; another user's demand of the same id is
        NOT_FOUND, as if there were none."""

        async def body(conn: Conn) -> list[Demand]:
            d = await store.get(conn, user, demand_id, with_events=True)
            return [] if d is None else await self._with_waits(conn, [d])

        found = await self.db.run(body, read_only=True)
        if not found:
            raise NotFound(f"demand {demand_id} not found")
        return found[0]

    async def list_demands(
        self, after: tuple[str, str], limit: int, state: str, user: str
    ) -> list[Demand]:
        """A page of demands, each with what its OrderBy waits for."""

        async def body(conn: Conn) -> list[Demand]:
            page = await store.list_demands(conn, after, limit, state, user)
            return await self._with_waits(conn, page)

        return await self.db.run(body, read_only=True)

    async def _with_waits(self, conn: Conn, demands: list[Demand]) -> list[Demand]:
        """The demands as they stand now (a parked one's rounds and occupation), each with
        what its OrderBy waits for."""
        keys = [key for d in demands for key in order_wait_keys(d)]
        now = self.clock.now()
        found = await store.predecessors_of(conn, keys, now, self.planner)
        return [as_of(with_order_wait(d, found, self.planner), now, self.planner) for d in demands]

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
            return await self.planning.fail(
                conn, d, "cancelled" + (f": {reason}" if reason else ""), now
            )

        outcome = await self.db.run_idempotent(idem, now, body, encoder)
        if isinstance(outcome, Demand):
            await self.planning.wake_successors(outcome)  # their OrderBy can never hold now
        return outcome

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

    async def check_reservations(self) -> list[str]:
        return await self.db.run(
            reservations.check_reservations, read_only=True, bound=self.db.slow_timeout
        )


async def _locked(conn: Conn, user: str | None, demand_id: str) -> Demand:
    d = await store.get(conn, user, demand_id, lock=True)
    if d is None:
        raise NotFound(f"demand {demand_id} not found")
    return d
