"""Entities the store returns and the service converts to protobuf.

Ticket lifecycle (a ticket is live in LOCKED and USED; RELEASED and EXPIRED
live only in the history table):

    Apply ──> LOCKED ──ReportUsed──> USED ──Release──> RELEASED
                │  └──────────────Release──────────────┘
                └──lock timeout / ReportUsed too late──> EXPIRED
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from labelrm_common.quantity import Shortfall
from rm_server.domain.engineconn import Isolation, MeasuredUsage
from rm_server.domain.labels import Label
from rm_server.domain.resources import Resource, ResourceError, headroom


class TicketState(enum.StrEnum):
    LOCKED = "LOCKED"
    USED = "USED"
    RELEASED = "RELEASED"
    EXPIRED = "EXPIRED"

    @property
    def live(self) -> bool:
        return self in (TicketState.LOCKED, TicketState.USED)


@dataclass(frozen=True)
class Ticket:
    ticket_id: str
    state: TicketState
    user: str
    labels: tuple[Label, ...]
    charged_labels: tuple[str, ...]
    requested: Resource
    locked: Resource
    used: Resource | None
    created_at: datetime
    updated_at: datetime
    lock_expires_at: datetime | None = None
    ended_at: datetime | None = None
    end_reason: str = ""
    # Set when the ticket was charged for an EngineConn: its lifecycle owns the ticket.
    engine_conn_id: str = ""
    # An EngineConn's ticket: what its agent measured it using (GetTicket only).
    measured: MeasuredUsage | None = None


@dataclass(frozen=True)
class LabelRecord:
    """What one label's record holds (its maximum, None: unlimited), the fields the ledger's
    LabelAccount and the read model's LabelResource both start with, in this order."""

    label: str
    source: str
    max_resource: Resource | None
    protected: Resource
    used: Resource
    locked: Resource
    live_tickets: int


@dataclass(frozen=True)
class LabelResource(LabelRecord):
    """A label's record as read for GetLabelResource and the console."""

    updated_at: datetime
    # Held for demands in their reservation window (an Apply counts it as in use).
    reserved: Resource | None = None

    def left(self) -> Resource | None:
        """What an Apply may still take (`left_of`)."""
        return left_of(self.max_resource, self.used, self.locked, self.protected, self.reserved)


def left_of(
    maximum: Resource | None,
    used: Resource,
    locked: Resource,
    protected: Resource,
    reserved: Resource | None,
) -> Resource | None:
    """What an Apply may still take from a label record: ``max - used - locked -
    protected - reserved``, clamped at 0 per dimension, as the ledger decides
    (`ledger.shortfalls_of` keeps protected capacity and demand reservations back).
    The one computation of "left" that ListLabelResources, GetEcm, ListEcms, the ECM
    ranking, the metrics and the console show. None without a maximum, and None when
    the parts do not combine (an ECM re-registered with another kind under live
    tickets: CheckConsistency reports that record)."""
    if maximum is None:
        return None
    try:
        held = protected if reserved is None else protected + reserved
        return headroom(maximum, used, locked, held)
    except ResourceError:
        return None


@dataclass(frozen=True)
class Ecm:
    instance: str
    label: str
    labels: tuple[Label, ...]
    total: Resource
    protected: Resource
    registered_at: datetime
    updated_at: datetime
    isolation: Isolation | None = None  # how its agent contains EngineConns, if it said


@dataclass(frozen=True)
class Registration:
    """An ECM's record after (re-)registration; whether its total resource changed."""

    ecm: Ecm
    resource_changed: bool


@dataclass(frozen=True)
class StoredLimit:
    pattern: str
    max_resource: Resource
    updated_at: datetime


@dataclass(frozen=True)
class Mismatch:
    label: str
    field: str
    stored: Resource | None
    expected: Resource | None
    detail: str


@dataclass(frozen=True)
class ConsistencyReport:
    mismatches: tuple[Mismatch, ...]
    labels_checked: int
    tickets_checked: int
    # Labels in use beyond their maximum (a limit lowered below usage): expected, and
    # not counted as inconsistencies.
    over_limit: tuple[Mismatch, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """An Apply that did not fit now: the shortfalls, or earlier waiters ahead of it."""

    shortfalls: tuple[Shortfall, ...]
    queued_behind: tuple[str, ...] = ()
    detail: str = ""  # how an external figure was reached (rm_server/domain/external.py)
