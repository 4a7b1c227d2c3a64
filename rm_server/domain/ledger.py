"""The ticket ledger's rules: Apply, ReportUsed and Release (or expiry) over label
accounts, in memory, without I/O.

The store (rm_server/store/tickets.py) reads and locks the accounts a group of
requests needs, runs these rules request by request, and writes back what changed.
Every rule is all-or-nothing: it returns the accounts it changed and the new state
of the ticket, or raises / returns a refusal and changes nothing.

Per label account, at all times: ``used`` and ``locked`` never go negative; the
sum of ``locked`` over the live LOCKED tickets charged to the label equals the
account's ``locked``, and likewise ``used`` for USED tickets and ``live_tickets``
for all live ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from rm_server.domain.admission import ECM_SOURCE, charged_part, label_shortfalls
from rm_server.domain.external import QueueCheck
from rm_server.domain.labels import USER_CREATOR, Label, ecm_instance
from rm_server.domain.model import LabelRecord, Refusal, Ticket, TicketState
from rm_server.domain.resources import (
    MAX_QUANTITY,
    Resource,
    ResourceError,
    ResourceOverflowError,
    Shortfall,
    headroom,
)
from rm_server.errors import (
    EcmNotRegistered,
    EcmNotRunning,
    FailedPrecondition,
    InvalidArgument,
    LabelrmError,
    NotFound,
    ResourceExhausted,
    not_found,
)


@dataclass(frozen=True)
class LabelAccount(LabelRecord):
    """One label's record as the ledger decides on it: its maximum (None: unlimited) and
    what is held on it."""

    # Held for ALLOCATING time-aware demands: counted as in use by check_accounts.
    reserved: Resource | None = None
    # The state of the ECM whose record this is (RUNNING, CORDONED, DRAINING, LOST), read
    # with it by the Apply path; None for every other record.
    ecm_state: str | None = None

    def part(self, resource: Resource) -> Resource:
        """What this account is charged for a ticket's `resource` (an ECM's record: the
        part it holds; admission.charged_part)."""
        return charged_part(self.source, self.max_resource, resource)


@dataclass(frozen=True)
class ApplyCommand:
    """An Apply to decide: charge `resource` on every account of `keys`, or refuse."""

    ticket_id: str
    user: str
    labels: tuple[Label, ...]
    keys: tuple[str, ...]  # resource-carrying labels, canonical (sorted) order
    resource: Resource
    now: datetime
    lock_expires_at: datetime
    waiter_seq: int | None = None
    may_wait: bool = False
    engine_conn_id: str = ""  # the EngineConn the ticket is charged for, if any
    # A YARN queue the request must also fit (its record is one of `keys`).
    external: QueueCheck | None = None


def resource_refusal(
    label: str, current: Resource, request: Resource, exc: ResourceError
) -> LabelrmError:
    """Why `request` cannot be added to `current` on `label`: a sum past the largest
    quantity a record holds is a capacity answer (RESOURCE_EXHAUSTED naming the
    dimension); anything else is a request of the wrong type for the label."""
    if isinstance(exc, ResourceOverflowError):
        dim = exc.dimension
        available = max(0, MAX_QUANTITY - current.get(dim))
        return ResourceExhausted(
            "insufficient resource", [Shortfall(label, dim, request.get(dim), available)]
        )
    return InvalidArgument("resource", f"does not match label {label}: {exc}")


@dataclass(frozen=True)
class Waiter:
    """A waiting Apply queued on a label: who, for what, holding back until when."""

    seq: int
    user: str
    resource: Resource | None
    hold_until: datetime | None


def is_user_label(label: str) -> bool:
    """A label a userCreator is part of: one user's quota, charged by no one else.
    (Charged labels are "key=value" parts joined by commas, values already valid.)"""
    return any(part.split("=", 1)[0] == USER_CREATOR for part in label.split(","))


def blocked_by_own_quota(refusal: Refusal) -> bool:
    """The refusal names a user label: the request is over its own user's quota, which
    no other user's release can cure."""
    return any(is_user_label(s.label) for s in refusal.shortfalls)


def held_back(
    account: LabelAccount, waiters: Sequence[Waiter], seq: int, now: datetime
) -> Resource | None:
    """What the waiters ahead of `seq` hold back on `account` (None: nothing).

    A waiter holds its request on a label only while its hold lasts (`hold_until`;
    the RM ends it early for a waiter over its own quota), never on a user label (its
    own quota), and only where its request could fit the label's maximum at all (one
    that can never be satisfied holds nothing); only the earliest waiter of each user
    counts, so one user cannot stack holds. (It holds where it already fits too: it is about
    to be granted there, and a newcomer must not take that capacity first.)"""
    if account.max_resource is None:
        return None
    quota = is_user_label(account.label)
    users: set[str] = set()
    held: Resource | None = None
    for w in sorted(waiters, key=lambda w: w.seq):
        if w.seq >= seq:
            break
        if w.user in users:
            continue
        users.add(w.user)
        if w.hold_until is not None and w.hold_until <= now:
            continue
        if w.resource is None:  # what it waits for is unknown (an older row): no hold
            continue
        if quota:
            continue  # a user's own quota: their later requests are not held back
        try:
            part = account.part(w.resource)  # an ECM's record holds its part only
            zero = Resource.zero(part.kind, part.queue)
            capacity = replace(account, used=zero, locked=zero, reserved=None)
            if shortfalls_of([capacity], part):
                continue  # can never fit this label
            held = part if held is None else held + part
        except (ResourceError, InvalidArgument, ResourceExhausted):
            # Deliberate: a request this label cannot measure (another type, or a sum
            # past the largest quantity) can never be granted here, so it holds nothing;
            # it is refused on its own turn, with the reason.
            continue
    return held


def _charge(account: LabelAccount, resource: Resource) -> LabelAccount:
    try:
        part = account.part(resource)
        return replace(account, locked=account.locked + part, live_tickets=account.live_tickets + 1)
    except ResourceError as exc:
        raise resource_refusal(account.label, account.locked, resource, exc) from exc


def check_ecms(keys: Sequence[str], accounts: Mapping[str, LabelAccount]) -> None:
    """Every ECM an Apply names can take work: registered (its record exists, an ECM's)
    and RUNNING. Other labels without a record are skipped (no record, no limit)."""
    for key in keys:
        instance = ecm_instance(key)
        if instance is None:
            continue
        account = accounts.get(key)
        if account is None or account.source != ECM_SOURCE:
            raise EcmNotRegistered(f"ECM {instance} is not registered")
        if account.ecm_state not in (None, "RUNNING"):
            raise EcmNotRunning(
                f"ECM {instance} is {account.ecm_state}: it takes no new work",
                state=account.ecm_state,
            )


def shortfalls_of(
    accounts: Sequence[LabelAccount],
    resource: Resource,
    held: Mapping[str, Resource] | None = None,
) -> list[Shortfall]:
    """Every dimension of `resource` that an account with a maximum cannot cover.
    Protected capacity, demand reservations and `held` (per label) are not handed out."""
    shortfalls: list[Shortfall] = []
    for account in accounts:
        maximum = account.max_resource
        if maximum is None:
            continue
        try:
            kept = account.protected
            if account.reserved is not None:
                kept = kept + account.reserved
            extra = None if held is None else held.get(account.label)
            if extra is not None:
                kept = kept + extra
            a = account
            part = a.part(resource)
            shortfalls.extend(label_shortfalls(a.label, maximum, a.used, a.locked, kept, part))
        except ResourceError as exc:
            raise resource_refusal(account.label, account.locked, resource, exc) from exc
    return shortfalls


def check_accounts(
    accounts: Sequence[LabelAccount],
    resource: Resource,
    held: Mapping[str, Resource] | None = None,
) -> Refusal | None:
    """Every shortfall over the accounts; else the labels where `resource` does not
    fit in what waiters ahead hold back (`held`); None when it fits."""
    shortfalls = shortfalls_of(accounts, resource)
    if shortfalls:
        return Refusal(tuple(shortfalls))
    if held:
        behind = tuple(
            a.label for a in accounts if a.label in held and shortfalls_of([a], resource, held)
        )
        if behind:
            return Refusal((), behind)
    return None


def more_room(before: Sequence[LabelAccount], after: Sequence[LabelAccount]) -> bool:
    """Whether an Apply refused on the accounts ``before`` may fit on ``after`` (the same
    labels read again, in the same order).

    A refusal is monotone: headroom is ``max - used - locked - protected - reserved``, so
    an Apply refused under ``before`` is refused again unless some account has a higher
    maximum, or less held (protected, used, locked, reserved), in some dimension. This
    lets the demand planner pass a blocked demand over while the others around it only
    take more (their reservations, new tickets) instead of trying it again on every
    change. Anything it cannot compare counts as more room: a record come or gone,
    another source, a resource of another type.
    """
    if len(before) != len(after):
        return True
    try:
        return any(_grown(b, a) for b, a in zip(before, after, strict=True))
    except ResourceError:
        return True


def _grown(before: LabelAccount, after: LabelAccount) -> bool:
    if (before.label, before.source) != (after.label, after.source):
        return True
    if after.max_resource is None:  # no maximum: unlimited
        if before.max_resource is not None:
            return True
    elif before.max_resource is not None and not before.max_resource.ge(after.max_resource):
        return True
    held = zip(
        (before.protected, before.used, before.locked),
        (after.protected, after.used, after.locked),
        strict=True,
    )
    if any(not now.ge(then) for then, now in held):
        return True
    if before.reserved is None:
        return False
    if after.reserved is None:
        return not before.reserved.is_zero()
    return not after.reserved.ge(before.reserved)


def decide_apply(
    cmd: ApplyCommand,
    accounts: Mapping[str, LabelAccount],
    held: Mapping[str, Resource] | None = None,
) -> tuple[list[LabelAccount], Ticket] | Refusal:
    """Check every account of the command's keys, then charge all or none: the charged
    accounts and the new LOCKED ticket, or the refusal. Keys without an account are
    labels that need none (no record and no limit)."""
    check_ecms(cmd.keys, accounts)
    ordered = [accounts[k] for k in cmd.keys if k in accounts]
    charged = [_charge(a, cmd.resource) for a in ordered]  # validates kinds first
    refusal = check_accounts(ordered, cmd.resource, held)
    if cmd.external is not None:
        refusal = _external_refusal(cmd, accounts, refusal)
    if refusal is not None:
        return refusal
    ticket = Ticket(
        ticket_id=cmd.ticket_id,
        state=TicketState.LOCKED,
        user=cmd.user,
        labels=cmd.labels,
        charged_labels=tuple(a.label for a in ordered),
        requested=cmd.resource,
        locked=cmd.resource,
        used=None,
        created_at=cmd.now,
        updated_at=cmd.now,
        lock_expires_at=cmd.lock_expires_at,
        engine_conn_id=cmd.engine_conn_id,
    )
    return charged, ticket


def _external_refusal(
    cmd: ApplyCommand, accounts: Mapping[str, LabelAccount], refusal: Refusal | None
) -> Refusal | None:
    """The queue's refusal (its live headroom minus the in-flight part its account holds)
    merged with the labels' own."""
    assert cmd.external is not None
    queue = accounts.get(cmd.external.label)
    if queue is None:  # created before the Apply (rm_server/app/core.py)
        raise FailedPrecondition(f"no record of queue {cmd.external.label}", state="NO_RECORD")
    outside = cmd.external.refusal(queue.locked, cmd.resource)
    if outside is None:
        return refusal
    if refusal is None:
        return outside
    return replace(
        outside,
        shortfalls=refusal.shortfalls + outside.shortfalls,
        queued_behind=refusal.queued_behind,
    )


def lock_expired(ticket: Ticket, now: datetime) -> bool:
    """A LOCKED ticket past its lock timeout: ReportUsed expires it (and fails)."""
    return (
        ticket.state is TicketState.LOCKED
        and ticket.lock_expires_at is not None
        and now >= ticket.lock_expires_at
    )


def lock_expired_error(ticket_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"ticket {ticket_id} was not reported within the lock timeout",
        state="EXPIRED",
        reason="LOCK_EXPIRED",
    )


def not_live_error(ticket_id: str, ended: Ticket | None) -> FailedPrecondition | NotFound:
    """Why a ticket that is not live cannot be reported: ended (`ended`), or unknown."""
    if ended is None:
        return not_found("ticket", ticket_id)
    return FailedPrecondition(
        f"ticket {ticket_id} is {ended.state.value} ({ended.end_reason})",
        state=ended.state.value,
        reason="TICKET_ENDED",
    )


def check_user_may_end(ticket: Ticket) -> None:
    """A user's ReportUsed / Release: refused on a ticket an EngineConn owns (its
    lifecycle reports and releases it; ending it under a running EngineConn would hand
    out capacity the EngineConn still uses)."""
    if ticket.engine_conn_id:
        raise FailedPrecondition(
            f"ticket {ticket.ticket_id} belongs to EngineConn {ticket.engine_conn_id}:"
            " end it with KillEngineConn",
            state=ticket.state.value,
            reason="TICKET_OWNED_BY_ENGINECONN",
        )


def decide_report(
    ticket: Ticket, accounts: Mapping[str, LabelAccount], used: Resource | None, now: datetime
) -> tuple[list[LabelAccount], Ticket, bool]:
    """LOCKED -> USED (the lock is not expired): the updated accounts, the USED ticket,
    and whether part of the lock was freed. `used` None means all of the lock."""
    ticket_id = ticket.ticket_id
    if ticket.state is not TicketState.LOCKED:
        raise FailedPrecondition(
            f"ticket {ticket_id} is {ticket.state.value}, not LOCKED",
            state=ticket.state.value,
            reason="TICKET_NOT_LOCKED",
        )
    actual = ticket.locked if used is None else used
    try:  # a used resource of another type than the lock's (or an account's)
        within = ticket.locked.ge(actual)
        remainder = ticket.locked - actual if within else None
        updated = [
            replace(a, locked=a.locked - a.part(ticket.locked), used=a.used + a.part(actual))
            for label in ticket.charged_labels
            if within and (a := accounts.get(label)) is not None
        ]
    except ResourceError as exc:
        raise InvalidArgument("used_resource", str(exc)) from exc
    if remainder is None:
        raise FailedPrecondition(
            f"used_resource exceeds what ticket {ticket_id} locked",
            state="LOCKED",
            reason="USED_EXCEEDS_LOCKED",
        )
    zero = Resource.zero(ticket.locked.kind, ticket.locked.queue)
    reported = replace(
        ticket,
        state=TicketState.USED,
        used=actual,
        locked=zero,
        updated_at=now,
        lock_expires_at=None,
    )
    return updated, reported, not remainder.is_zero()


def reserve(account: LabelAccount, resource: Resource) -> LabelAccount:
    """`account` with a time-aware demand's `resource` reserved on it (an ECM's record:
    the part it holds), or InvalidArgument naming the demand's ``resource`` when that
    does not match the label (checked as an Apply's would be)."""
    try:
        part = account.part(resource)
        held = part if account.reserved is None else account.reserved + part
    except ResourceError as exc:
        raise InvalidArgument("resource", f"does not match label {account.label}: {exc}") from exc
    reserved = replace(account, reserved=held)
    check_accounts([reserved], resource)  # raises when the kinds do not match
    return reserved


def unreserve(account: LabelAccount, resource: Resource) -> Resource | None:
    """What `account` keeps reserved once a demand's reservation of `resource` is taken
    off (None: nothing). The demand's part is measured in the type the reservation holds,
    the record's type when it was made: an ECM that re-registered since with another
    type (allowed while it has no live tickets) has changed its maximum, not what was
    reserved on it."""
    reserved = account.reserved
    if reserved is None:
        return None
    part = charged_part(account.source, reserved, resource)
    zero = Resource.zero(reserved.kind, reserved.queue)
    left = headroom(reserved, part, zero, zero)  # clamped at zero
    return None if left.is_zero() else left


def decide_end(
    ticket: Ticket,
    accounts: Mapping[str, LabelAccount],
    now: datetime,
    final_state: TicketState,
    reason: str,
) -> tuple[list[LabelAccount], Ticket]:
    """A live ticket's resource returned to its accounts: the updated accounts and the
    ended ticket. An account that is gone (its ECM unregistered) is skipped."""
    updated = []
    for label in ticket.charged_labels:
        a = accounts.get(label)
        if a is None:
            continue
        used = a.used - a.part(ticket.used) if ticket.used is not None else a.used
        locked = a.locked - a.part(ticket.locked)
        updated.append(replace(a, used=used, locked=locked, live_tickets=a.live_tickets - 1))
    ended = replace(
        ticket,
        state=final_state,
        locked=Resource.zero(ticket.locked.kind, ticket.locked.queue),
        ended_at=now,
        end_reason=reason,
        lock_expires_at=None,
    )
    return updated, ended
