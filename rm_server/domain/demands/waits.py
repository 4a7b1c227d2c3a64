"""What a demand's OrderBy waits for, pure: its named demands as its user has them, the
ones it still waits for, and the bound by which the ones not submitted must be.

OrderBy names the submitting user's own demands (demand ids are per user), and may name
ids not submitted yet: the demand waits for them. A wait for a demand that never comes is
bounded: past its window (plus the slip bound when loose), or, without an end to its
window, past the operator's default after its submission, a demand whose OrderBy can
only hold once a demand not submitted yet exists FAILS with ``ORDER_BY_MISSING``
(planner.decide). Meanwhile GetDemand, ``rmctl demand show`` and the console say what it
waits for (:func:`wait_text`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from rm_server.domain.demands.state import DemandState
from rm_server.domain.demands.timelang import OrderBy, order_ids, order_value

ORDER_BY_MISSING = "ORDER_BY_MISSING"


@dataclass(frozen=True)
class Predecessor:
    """A demand an OrderBy names, as the waiting demand's user has it."""

    demand_id: str
    state: DemandState | None  # None: no demand of that id submitted (by this user)
    planned_end: datetime | None = None  # its plan end while it is planned


@dataclass(frozen=True)
class OrderWait:
    """The named demands not FINISHED (in the order OrderBy names them), and, when its
    OrderBy cannot hold without one not submitted yet, the instant past which the demand
    fails with ORDER_BY_MISSING."""

    pending: tuple[Predecessor, ...]
    missing_by: datetime | None = None


def finished_of(states: Mapping[str, DemandState | None]) -> dict[str, bool | None]:
    """OrderBy's view of its named demands: True when FINISHED, False when FAILED, None
    otherwise (not submitted included)."""
    return {
        i: True if s is DemandState.FINISHED else False if s is DemandState.FAILED else None
        for i, s in states.items()
    }


def needed_missing(order: OrderBy, states: Mapping[str, DemandState | None]) -> tuple[str, ...]:
    """The named ids not submitted, when the OrderBy can no longer hold unless one of them
    is (it would be False with them FAILED); empty otherwise (nothing is missing, or what
    is submitted can still satisfy it)."""
    missing = tuple(i for i in order_ids(order) if states.get(i) is None)
    if not missing:
        return ()
    without = {**finished_of(states), **dict.fromkeys(missing, False)}
    return missing if order_value(order, without) is False else ()


def order_wait(
    order: OrderBy | None, predecessors: Mapping[str, Predecessor], bound: datetime
) -> OrderWait | None:
    """What a demand ordered by ``order`` waits for (None when it waits for nothing:
    no OrderBy, or satisfied, or never satisfiable). ``bound``: when its missing ones
    must have been submitted (planner.order_bound)."""
    if order is None:
        return None
    states = {i: p.state for i, p in predecessors.items()}
    states.update({i: None for i in order_ids(order) if i not in states})
    if order_value(order, finished_of(states)) is not None:
        return None
    pending = tuple(
        predecessors.get(i, Predecessor(i, None))
        for i in order_ids(order)
        if states[i] is not DemandState.FINISHED
    )
    return OrderWait(pending, bound if needed_missing(order, states) else None)


def _fmt(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_text(wait: OrderWait | None) -> str:
    """One line: "waiting for c-000: not submitted (ORDER_BY_MISSING after …)", or
    "waiting for etl: MONITORING, planned end …"; empty when it waits for nothing."""
    if wait is None or not wait.pending:
        return ""
    parts = []
    for p in wait.pending:
        if p.state is None:
            parts.append(f"{p.demand_id}: not submitted")
        elif p.planned_end is not None and p.state.active:
            parts.append(f"{p.demand_id}: {p.state.value}, planned end {_fmt(p.planned_end)}")
        else:
            parts.append(f"{p.demand_id}: {p.state.value}")
    text = "waiting for " + "; ".join(parts)
    if wait.missing_by is not None:
        text += f" ({ORDER_BY_MISSING} after {_fmt(wait.missing_by)})"
    return text
