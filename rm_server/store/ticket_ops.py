"""What a request to the one ticket path is (`Op` and its kinds) and how it can end
besides a ticket: refused, must wait, or limit rows to create first.

`rm_server.store.tickets.run` takes a sequence of these; the use cases build them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rm_server.domain.external import QueueCheck
from rm_server.domain.labels import Label
from rm_server.domain.ledger import ApplyCommand
from rm_server.domain.model import Refusal, Ticket
from rm_server.domain.resources import Resource
from rm_server.errors import ResourceExhausted
from rm_server.store.db import Conn, Idempotency, OutcomeEncoder

AfterApply = Callable[[Conn, Ticket], Awaitable[None]]


class NeedLimitRows(Exception):
    """Labels without a record have a configured limit: create their rows, then retry."""

    def __init__(self, labels: Sequence[str]) -> None:
        super().__init__(", ".join(labels))
        self.labels = tuple(labels)


class MustWait(Exception):
    """An Apply that may wait did not fit: roll back and wait for a release."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__("must wait")
        self.refusal = refusal


class Refused(ResourceExhausted):
    """An Apply that does not fit (the final answer to it); `refusal` says why."""

    def __init__(self, refusal: Refusal) -> None:
        if refusal.shortfalls:
            detail = f" ({refusal.detail})" if refusal.detail else ""  # a YARN queue's breakdown
            super().__init__("insufficient resource" + detail, refusal.shortfalls)
        else:
            super().__init__(
                "queued behind earlier waiting applies on " + ", ".join(refusal.queued_behind),
                reason="QUEUED_BEHIND_WAITERS",
            )
        self.refusal = refusal


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


@dataclass(eq=False)
class ApplyOp(Op):
    ticket_id: str
    user: str
    labels: tuple[Label, ...]
    keys: tuple[str, ...]  # canonical order
    resource: Resource
    lock_timeout: timedelta
    waiter_seq: int | None = None
    may_wait: bool = False
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
            may_wait=self.may_wait,
            engine_conn_id=self.engine_conn_id,
            external=self.external,
        )


@dataclass(eq=False)
class ReportOp(Op):
    ticket_id: str
    used: Resource | None
    from_user: bool = False  # a user's RPC: refused on EngineConn-owned tickets


@dataclass(eq=False)
class ReleaseOp(Op):
    ticket_id: str
    reason: str = "released"
    from_user: bool = False  # a user's RPC: refused on EngineConn-owned tickets


@dataclass(eq=False)
class ExpireOp(Op):
    """Reclaim a LOCKED ticket past its lock timeout; None if it no longer qualifies."""

    ticket_id: str
