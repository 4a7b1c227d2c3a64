"""What a request to the one ticket path is (`Op` and its kinds): the domain's command
(rm_server/domain/ticket_group.py) with what the store needs around it, the request id
its outcome is logged under and how that outcome is encoded.

`rm_server.store.tickets.run` takes a sequence of these; the use cases build them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from rm_server.domain.external import QueueCheck
from rm_server.domain.labels import Label
from rm_server.domain.ledger import ApplyCommand
from rm_server.domain.model import Ticket
from rm_server.domain.resources import Resource
from rm_server.domain.ticket_group import (
    Command,
    ExpireCommand,
    ReleaseCommand,
    ReportCommand,
)
from rm_server.store.db import Conn, Idempotency, OutcomeEncoder

AfterApply = Callable[[Conn, Ticket], Awaitable[None]]


@dataclass(eq=False)
class Op:
    """One request. `idem` (and `encoder`) when its outcome is logged by request id."""

    idem: Idempotency | None
    encoder: OutcomeEncoder[Ticket] | None

    @property
    def key(self) -> tuple[str, str, str]:
        """(caller, method, request id): request ids are the caller's own."""
        if self.idem is None:
            return ("", "", str(id(self)))
        return (self.idem.caller, self.idem.method, self.idem.request_id)

    def command(self, now: datetime) -> Command:
        """The request, as the domain decides it."""
        raise NotImplementedError


@dataclass(eq=False)
class ApplyOp(Op):
    ticket_id: str
    user: str
    labels: tuple[Label, ...]
    keys: tuple[str, ...]  # canonical order
    resource: Resource
    lock_timeout: timedelta
    waiter_seq: int | None = None
    # Runs in the same transaction once the ticket is written (the EngineConn flow
    # queues its launch command there, atomically).
    after: AfterApply | None = None
    engine_conn_id: str = ""  # the EngineConn the ticket is for: its lifecycle owns it
    external: QueueCheck | None = None  # a YARN queue it must also fit

    def command(self, now: datetime) -> ApplyCommand:
        return ApplyCommand(
            ticket_id=self.ticket_id,
            user=self.user,
            labels=self.labels,
            keys=self.keys,
            resource=self.resource,
            now=now,
            lock_expires_at=now + self.lock_timeout,
            waiter_seq=self.waiter_seq,
            engine_conn_id=self.engine_conn_id,
            external=self.external,
        )


@dataclass(eq=False)
class ReportOp(Op):
    ticket_id: str
    used: Resource | None
    from_user: bool = False  # a user's RPC: refused on EngineConn-owned tickets

    def command(self, now: datetime) -> ReportCommand:
        return ReportCommand(self.ticket_id, self.used, self.from_user)


@dataclass(eq=False)
class ReleaseOp(Op):
    ticket_id: str
    reason: str = "released"
    from_user: bool = False  # a user's RPC: refused on EngineConn-owned tickets

    def command(self, now: datetime) -> ReleaseCommand:
        return ReleaseCommand(self.ticket_id, self.reason, self.from_user)


@dataclass(eq=False)
class ExpireOp(Op):
    """Reclaim a LOCKED ticket past its lock timeout; None if it no longer qualifies."""

    ticket_id: str

    def command(self, now: datetime) -> ExpireCommand:
        return ExpireCommand(self.ticket_id)
