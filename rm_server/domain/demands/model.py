"""A stored demand, and the planner's views of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from rm_server.domain.demands.evaluation import (
    deadline_at,
    resolve,
)
from rm_server.domain.demands.planner import (
    Candidate,
    DemandView,
    Hold,
    PlannerSettings,
    occupation,
    order_bound,
    passes_since,
)
from rm_server.domain.demands.state import DemandState, Transition
from rm_server.domain.demands.timelang import (
    AllOf,
    Conditions,
    DemandRef,
    Expr,
    OrderBy,
    Span,
    Strategy,
    order_ids,
)
from rm_server.domain.demands.waits import OrderWait, Predecessor, order_wait
from rm_server.domain.labels import Label
from rm_server.domain.resources import Resource


@dataclass(frozen=True)
class DemandSpec:
    """What a client submits (conditions without DemandID: it is ``demand_id``)."""

    demand_id: str
    user: str
    labels: tuple[Label, ...]
    resource: Resource
    conditions: Conditions


def window_of(conditions: Conditions, submitted: datetime) -> Expr:
    """The resolved Start window; no Start means "from submission on"."""
    if conditions.start is None:
        return Span(submitted, None)
    return resolve(conditions.start.expr, submitted)


def hold_of(conditions: Conditions, submitted: datetime) -> Hold:
    duration = deadline = None
    strict = False
    if conditions.duration is not None:
        duration = timedelta(seconds=conditions.duration.seconds)
    if conditions.deadline is not None:
        deadline = deadline_at(conditions.deadline, submitted)
        strict = conditions.deadline.strategy is Strategy.STRICT
    return Hold(duration, deadline, strict)


def strategy_of(conditions: Conditions) -> Strategy:
    return Strategy.STRICT if conditions.start is None else conditions.start.strategy


def candidate(
    spec: DemandSpec, charged: tuple[str, ...], submitted: datetime, not_before: datetime | None
) -> Candidate:
    c = spec.conditions
    return Candidate(
        spec.demand_id,
        charged,
        spec.resource,
        window_of(c, submitted),
        strategy_of(c),
        submitted,
        hold_of(c, submitted),
        not_before,
        spec.user,
    )


def not_before(order: OrderBy | None, ends: Mapping[str, datetime | None]) -> datetime | None:
    """The earliest start OrderBy allows by the plan: after the planned ends of the named
    demands (all of them for AND, the first for OR). An id with no known end (finished,
    unbounded or not yet submitted) puts no bound."""
    if order is None:
        return None
    if isinstance(order, DemandRef):
        return ends.get(order.demand_id)
    bounds = [not_before(i, ends) for i in order.items]
    if isinstance(order, AllOf):
        known = [b for b in bounds if b is not None]
        return max(known) if known else None
    return None if any(b is None for b in bounds) else min(b for b in bounds if b is not None)


@dataclass(frozen=True)
class Demand:
    demand_id: str
    state: DemandState
    reason: str
    user: str
    labels: tuple[Label, ...]
    charged_labels: tuple[str, ...]
    resource: Resource
    conditions: Conditions
    submitted_at: datetime
    planned_start: datetime
    plan_start: datetime
    plan_end: datetime | None
    slip: timedelta
    rounds: int
    closed_at: datetime | None
    reserved_labels: tuple[str, ...]
    ticket_id: str | None
    allocated_at: datetime | None
    claim_expires_at: datetime | None
    claimed_at: datetime | None
    ended_at: datetime | None
    overruns: tuple[str, ...]
    next_check_at: datetime | None
    updated_at: datetime
    definition_hash: bytes
    events: tuple[Transition, ...] = ()
    order_wait: OrderWait | None = None  # what its OrderBy waits for (reads only)
    # Parked since the pass that began then (planner.park_until): its passed-over rounds
    # count on with the time, and it occupies the plan from now on.
    parked_at: datetime | None = None

    def view(self) -> DemandView:
        c = self.conditions
        return DemandView(
            state=self.state,
            window=window_of(c, self.submitted_at),
            strategy=strategy_of(c),
            submitted=self.submitted_at,
            planned_start=self.planned_start,
            hold=hold_of(c, self.submitted_at),
            duration_strict=c.duration is not None and c.duration.strategy is Strategy.STRICT,
            order=c.order_by,
            rounds=self.rounds,
            closed_at=self.closed_at,
            allocated_at=self.allocated_at,
            claim_expires_at=self.claim_expires_at,
            overruns=frozenset(self.overruns),
        )


def order_wait_keys(d: Demand) -> list[tuple[str, str]]:
    """The (user, demand id) pairs whose state tells what ``d`` waits for: the demands its
    OrderBy names, while it is ACCEPTED (none otherwise)."""
    if d.state is not DemandState.ACCEPTED or d.conditions.order_by is None:
        return []
    return [(d.user, i) for i in order_ids(d.conditions.order_by)]


def with_order_wait(
    d: Demand, found: Mapping[tuple[str, str], Predecessor], settings: PlannerSettings
) -> Demand:
    """``d`` with what its OrderBy waits for (``found``: the demands of order_wait_keys)."""
    keys = order_wait_keys(d)
    if not keys:
        return d
    named = {i: found[(user, i)] for user, i in keys if (user, i) in found}
    view = d.view()
    return replace(d, order_wait=order_wait(view.order, named, order_bound(view, settings)))


def as_of(d: Demand, now: datetime, settings: PlannerSettings) -> Demand:
    """``d`` as it stands at ``now``: a parked demand with the rounds it has been passed
    over since it was parked, and its occupation of the plan from now (what the planner
    would have written, round after round, had it not parked it)."""
    if d.parked_at is None or not d.state.active:
        return d
    rounds = d.rounds
    if d.state is DemandState.ALLOCATING:
        rounds += passes_since(d.parked_at, now, settings.round_length)
    view = replace(d.view(), rounds=rounds)
    start, end = occupation(view, now, settings)
    return replace(d, rounds=rounds, plan_start=start, plan_end=end)
