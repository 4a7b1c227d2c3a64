"""The decision of a group of ticket requests, in memory, without I/O.

The store (rm_server/store/tickets.py) reads and locks what a group of Apply, ReportUsed,
Release and expiry requests needs (`GroupView`), `decide_group` runs the ledger's rules
(rm_server/domain/ledger.py) request by request, and the store writes what changed
(`GroupState`). A request sees the accounts as the requests before it left them, so each
is all-or-nothing, waiters keep their FIFO order, and a request that is refused changes
nothing for it and nothing for the others.

Every request gets an outcome, a value, in the way the Kubernetes scheduler framework's
Filter plugins return a Status rather than raise: the ticket (or None: nothing to
expire); a `Refusal` (it did not fit: the caller waits or refuses); `NeedsRows` (labels a
limit covers have no record yet: the caller creates them and tries again); or the
domain's error saying why it cannot be done (rm_server/domain/errors.py: unknown ticket,
ended ticket, a state that forbids it). An error that `settles` the request keeps its
effects (a ReportUsed past the lock timeout expires the ticket, and is refused); every
other outcome that is not a ticket leaves the state as it was before the request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rm_server.domain.errors import DomainError
from rm_server.domain.ledger import (
    ApplyCommand,
    LabelAccount,
    Waiter,
    check_user_may_end,
    decide_apply,
    decide_end,
    decide_report,
    held_back,
    lock_expired,
    lock_expired_error,
    not_live_error,
    ticket_not_found,
)
from rm_server.domain.model import Refusal, Ticket, TicketState
from rm_server.domain.resources import Resource

NO_WAITER = 2**63 - 1  # a new request ranks after every registered waiter


@dataclass(frozen=True)
class ReportCommand:
    """ReportUsed: the ticket's lock becomes used (`used` None: all of it)."""

    ticket_id: str
    used: Resource | None
    from_user: bool = False  # a user's RPC: refused on EngineConn-owned tickets


@dataclass(frozen=True)
class ReleaseCommand:
    """Release: a live ticket ends; an ended one is answered as it is."""

    ticket_id: str
    reason: str = "released"
    from_user: bool = False  # a user's RPC: refused on EngineConn-owned tickets


@dataclass(frozen=True)
class ExpireCommand:
    """Reclaim a LOCKED ticket past its lock timeout (None: it no longer qualifies)."""

    ticket_id: str


Command = ApplyCommand | ReportCommand | ReleaseCommand | ExpireCommand


@dataclass(frozen=True)
class NeedsRows:
    """An Apply names labels that have no record but a configured limit: their records
    must be created first (outside the group), then the Apply tried again."""

    labels: tuple[str, ...]


# What a request ends with (module doc); an Exception is the domain's error, or a bug.
Outcome = Ticket | Refusal | NeedsRows | Exception | None


@dataclass(frozen=True)
class GroupView:
    """What the store read for a group, under its locks: the label accounts (locked, in
    canonical order) and the waiters queued on each, the live tickets (locked), the
    labels without a record that a limit covers, and the history of the tickets named
    that are not live."""

    accounts: Mapping[str, LabelAccount]
    waiters: Mapping[str, tuple[Waiter, ...]]
    tickets: Mapping[str, Ticket]
    need: frozenset[str]
    history: Mapping[str, Ticket]


_MISSING = object()


@dataclass
class GroupState:
    """The accounts and tickets as the requests so far left them. Every change goes
    through put() / notify_on(), which keep an undo log, so that a request refused
    is rolled back in memory (cost: its own changes)."""

    accounts: dict[str, LabelAccount]
    waiters: dict[str, tuple[Waiter, ...]]
    tickets: dict[str, Ticket | None]  # live tickets; None once ended in this group
    ended: dict[str, Ticket] = field(default_factory=dict)  # ended in this group
    history: list[tuple[Ticket, Ticket]] = field(default_factory=list)  # (live, ended)
    waiters_served: list[int] = field(default_factory=list)
    notify: set[str] = field(default_factory=set)  # labels with capacity freed
    _undo: list[tuple[Any, Any, Any]] = field(default_factory=list)

    def put(self, mapping: dict[Any, Any], key: Any, value: Any) -> None:
        self._undo.append((mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def notify_on(self, labels: Sequence[str]) -> None:
        for label in labels:
            if label not in self.notify:
                self._undo.append((self.notify, label, _MISSING))
                self.notify.add(label)

    def mark(self) -> tuple[int, int, int]:
        """Where the state is now (for restore)."""
        return len(self._undo), len(self.history), len(self.waiters_served)

    def restore(self, mark: tuple[int, int, int]) -> None:
        """Undo every change made since `mark`."""
        undo_len, history_len, served_len = mark
        while len(self._undo) > undo_len:
            target, key, old = self._undo.pop()
            if target is self.notify:
                self.notify.discard(key)
            elif old is _MISSING:
                del target[key]
            else:
                target[key] = old
        del self.history[history_len:]
        del self.waiters_served[served_len:]

    def end(self, ticket: Ticket, now: datetime, state: TicketState, reason: str) -> Ticket:
        updated, ended = decide_end(ticket, self.accounts, now, state, reason)
        for account in updated:
            self.put(self.accounts, account.label, account)
        self.put(self.tickets, ticket.ticket_id, None)
        self.put(self.ended, ticket.ticket_id, ended)
        self.history.append((ticket, ended))
        self.notify_on([a.label for a in updated])
        return ended


@dataclass
class GroupDecision:
    """The group's state after its requests, and one outcome per request."""

    state: GroupState
    outcomes: list[Outcome]


def decide_group(commands: Sequence[Command], view: GroupView, now: datetime) -> GroupDecision:
    """Each request in turn on the ledger's rules, seeing the accounts as the requests
    before it left them; one outcome per request (module doc)."""
    state = GroupState(dict(view.accounts), dict(view.waiters), dict(view.tickets))
    outcomes: list[Outcome] = []
    for command in commands:
        mark = state.mark()
        outcome: Outcome
        try:
            outcome = _decide(command, state, view, now)
        except Exception as exc:  # the domain's error (or a bug): the request's outcome
            outcome = exc
        if not _keeps_effects(outcome):
            state.restore(mark)
        outcomes.append(outcome)
    return GroupDecision(state, outcomes)


def _keeps_effects(outcome: Outcome) -> bool:
    if isinstance(outcome, Ticket) or outcome is None:
        return True
    return isinstance(outcome, DomainError) and outcome.settles


def _decide(command: Command, state: GroupState, view: GroupView, now: datetime) -> Outcome:
    if isinstance(command, ApplyCommand):
        return _apply(command, state, view.need, now)
    ticket = state.tickets.get(command.ticket_id)
    if isinstance(command, ExpireCommand):
        if ticket is None or not lock_expired(ticket, now):
            return None
        return state.end(ticket, now, TicketState.EXPIRED, "lock timeout")
    if ticket is not None and command.from_user:
        check_user_may_end(ticket)
    ended = None
    if ticket is None:
        ended = state.ended.get(command.ticket_id) or view.history.get(command.ticket_id)
    if isinstance(command, ReleaseCommand):
        if ticket is None:
            # Release is idempotent: an ended ticket is returned as it is.
            return ended if ended is not None else ticket_not_found(command.ticket_id)
        return state.end(ticket, now, TicketState.RELEASED, command.reason)
    if ticket is None:
        return not_live_error(command.ticket_id, ended)
    if lock_expired(ticket, now):
        state.end(ticket, now, TicketState.EXPIRED, "lock timeout")
        return lock_expired_error(command.ticket_id)  # settles: the expiry stands
    updated, reported, freed = decide_report(ticket, state.accounts, command.used, now)
    for account in updated:
        state.put(state.accounts, account.label, account)
    state.put(state.tickets, command.ticket_id, reported)
    if freed:
        state.notify_on([a.label for a in updated])
    return reported


def _apply(
    command: ApplyCommand, state: GroupState, need: frozenset[str], now: datetime
) -> Ticket | Refusal | NeedsRows:
    needed = tuple(k for k in command.keys if k in need)
    if needed:
        return NeedsRows(needed)
    seq = NO_WAITER if command.waiter_seq is None else command.waiter_seq
    held = {
        k: h
        for k in command.keys
        if (waiters := state.waiters.get(k))
        and (account := state.accounts.get(k)) is not None
        and (h := held_back(account, waiters, seq, now)) is not None
    }
    outcome = decide_apply(command, state.accounts, held)
    if isinstance(outcome, Refusal):
        return outcome
    charged, ticket = outcome
    for account in charged:
        state.put(state.accounts, account.label, account)
    state.put(state.tickets, ticket.ticket_id, ticket)
    if command.waiter_seq is not None:
        for k in command.keys:
            if k in state.waiters:
                left = tuple(w for w in state.waiters[k] if w.seq != command.waiter_seq)
                state.put(state.waiters, k, left)
        state.waiters_served.append(command.waiter_seq)
    return ticket
