"""Admission of a demand against the capacity plan (docs/demands.md, "How the RM plans
and allocates"): its OrderBy checked (no cycle, no FAILED predecessor), then placed at the
earliest start its window, its predecessors' planned ends and every label's plan allow,
all under the plan's advisory locks of its labels (store.demands.lock_plan), so that
concurrent submissions cannot take the same room. DemandManager.submit stores it."""

from __future__ import annotations

from datetime import datetime, timedelta

from rm_server.domain.demands import planner as plan
from rm_server.domain.demands.model import Demand, DemandSpec, candidate, not_before
from rm_server.domain.demands.state import DemandState
from rm_server.domain.demands.timelang import order_ids, order_value
from rm_server.domain.demands.waits import finished_of
from rm_server.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from rm_server.store import demands as store
from rm_server.store.db import Conn

S = DemandState


async def admit(
    conn: Conn,
    spec: DemandSpec,
    charged: tuple[str, ...],
    digest: bytes,
    now: datetime,
    planner: plan.PlannerSettings,
) -> Demand:
    """``spec`` placed in the plan as a NEW demand (not stored yet), under the OrderBy
    graph's lock and the plan's locks of its labels; refused with the reason otherwise."""
    order = spec.conditions.order_by
    ends: dict[str, datetime | None] = {}
    if order is not None:
        await store.lock_order_graph(conn)
        await refuse_cycles(conn, spec.user, spec.demand_id, order_ids(order))
        named = await store.predecessors(conn, spec.user, order_ids(order), now, planner)
        finished = finished_of({i: p.state for i, p in named.items()})
        if order_value(order, finished) is False:
            failed = ", ".join(i for i, v in finished.items() if v is False)
            raise FailedPrecondition(
                f"OrderBy can never be satisfied: {failed} FAILED",
                state="FAILED",
                reason="ORDER_BY_FAILED",
            )
        ends = {i: p.planned_end for i, p in named.items() if p.planned_end is not None}
    await store.lock_plan(conn, charged)
    cand = candidate(spec, charged, now, not_before(order, ends))
    key = (spec.user, spec.demand_id)
    entries = await store.plan_entries(conn, charged, now, key, planner)
    # A resource of the wrong type for a label: PlanError, INVALID_ARGUMENT (as_rm_error).
    placed = plan.place(cand, entries, await store.capacities(conn, charged), planner)
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


async def refuse_cycles(conn: Conn, user: str, demand_id: str, first: tuple[str, ...]) -> None:
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


def same_definition(existing: Demand, digest: bytes) -> Demand:
    if existing.definition_hash != digest:
        raise InvalidArgument(
            "demand_id",
            f"demand {existing.demand_id} exists with a different definition",
            reason="DEMAND_ID_REUSED",
        )
    return existing


def admitted(d: Demand) -> str:
    text = f"admitted: planned start {d.planned_start:%Y-%m-%dT%H:%M:%SZ}"
    if d.slip > timedelta(0):
        text += f", {d.slip} past its window (loose)"
    return text
