"""The demand state machine, as a transition table (the RMDemand of Wang Jian's paper on
extending Hadoop YARN resource requests and allocation with time factors).

::

    NEW ──> ACCEPTED ──> ALLOCATING ──> ALLOCATED ──> MONITORING ──> FINISHED
     │          │             │              │              │
     └──────────┴─────────────┴──────┬───────┴──────────────┘
                                     v
                                  FAILED

- NEW: received and well-formed (recorded at submission, in the same transaction).
- ACCEPTED: admitted against the capacity plan; waiting for its window and OrderBy.
- ALLOCATING: from a lead time before its planned start; its capacity is reserved on
  its labels and each scheduling round tries to allocate it (the normal Apply path).
- ALLOCATED: it holds a LOCKED ticket; the client must claim it within the claim timeout.
- MONITORING: claimed; duration and deadline are watched.
- FINISHED: its ticket was released (the work is done).
- FAILED: refused, cancelled, window missed, claim timeout, dependency failed, overrun
  with enforcement, or its ticket ended abnormally. Every state but FINISHED may fail.

FINISHED and FAILED are terminal. :func:`transition` is the only way to compute a new
state: it returns it or raises, so the store cannot write an invalid transition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from rm_server.domain.errors import DomainError


class DemandState(enum.StrEnum):
    NEW = "NEW"
    ACCEPTED = "ACCEPTED"
    ALLOCATING = "ALLOCATING"
    ALLOCATED = "ALLOCATED"
    MONITORING = "MONITORING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (DemandState.FINISHED, DemandState.FAILED)

    @property
    def active(self) -> bool:
        """Counted in the capacity plan and looked at by the planner."""
        return not self.terminal and self is not DemandState.NEW


_S = DemandState

TRANSITIONS: dict[DemandState, frozenset[DemandState]] = {
    _S.NEW: frozenset({_S.ACCEPTED, _S.FAILED}),
    _S.ACCEPTED: frozenset({_S.ALLOCATING, _S.FAILED}),
    _S.ALLOCATING: frozenset({_S.ALLOCATED, _S.FAILED}),
    _S.ALLOCATED: frozenset({_S.MONITORING, _S.FAILED}),
    _S.MONITORING: frozenset({_S.FINISHED, _S.FAILED}),
    _S.FINISHED: frozenset(),
    _S.FAILED: frozenset(),
}


class InvalidTransition(DomainError):
    def __init__(self, current: DemandState, target: DemandState) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (terminal)"
        super().__init__(f"a {current} demand cannot become {target}; allowed: {allowed}")
        self.current = current
        self.target = target


@dataclass(frozen=True)
class Transition:
    """One persisted step of a demand's history."""

    from_state: DemandState | None  # None: the demand was created
    to_state: DemandState
    at: datetime
    reason: str


def transition(current: DemandState, target: DemandState) -> DemandState:
    """``target`` if the table allows ``current -> target``; InvalidTransition otherwise."""
    if target not in TRANSITIONS[current]:
        raise InvalidTransition(current, target)
    return target


def step(current: DemandState, target: DemandState, at: datetime, reason: str) -> Transition:
    """The record of an allowed transition (raises like :func:`transition`)."""
    transition(current, target)
    return Transition(current, target, at, reason)
