"""The ledger's rules (rm_server/domain/ledger.py), without I/O: each all-or-nothing,
and over any sequence of Apply / ReportUsed / Release / expiry no account goes
negative and every account equals the sum of its live tickets (conservation:
locked + used + what is left = the maximum, less what is protected)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rm_server.domain.errors import Conflict, DomainError
from rm_server.domain.labels import Label
from rm_server.domain.ledger import (
    ApplyCommand,
    LabelAccount,
    Waiter,
    decide_apply,
    decide_end,
    decide_report,
    held_back,
    lock_expired,
    more_room,
    reserve,
    unreserve,
)
from rm_server.domain.model import Refusal, Ticket, TicketState
from rm_server.domain.resources import CPU, MEMORY, Resource, headroom

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ECM = "emInstance=host1:9000"
USER = "engineType=spark,userCreator=alice-IDE"
KEYS = (ECM, USER)
ZERO = Resource.load(0, 0)


def account(label: str, memory: int, cpu: int, protected: Resource = ZERO) -> LabelAccount:
    source = "ecm" if label == ECM else "limit"  # an emInstance label names an ECM's record
    return LabelAccount(label, source, Resource.load(memory, cpu), protected, ZERO, ZERO, 0)


def command(n: int, resource: Resource, now: datetime = T0, keys=KEYS) -> ApplyCommand:
    return ApplyCommand(
        ticket_id=f"t{n}",
        user="alice",
        labels=(Label("userCreator", "alice-IDE"),),
        keys=keys,
        resource=resource,
        now=now,
        lock_expires_at=now + timedelta(seconds=60),
    )


def test_apply_charges_every_account_or_none() -> None:
    accounts = {ECM: account(ECM, 10, 10), USER: account(USER, 4, 100)}
    refusal = decide_apply(command(1, Resource.load(5, 1)), accounts)
    assert isinstance(refusal, Refusal)
    assert [(s.label, s.dimension) for s in refusal.shortfalls] == [(USER, MEMORY)]
    charged, ticket = decide_apply(command(2, Resource.load(4, 1)), accounts)  # type: ignore[misc]
    assert [a.locked for a in charged] == [Resource.load(4, 1)] * 2
    assert [a.live_tickets for a in charged] == [1, 1]
    assert ticket.charged_labels == KEYS and ticket.state is TicketState.LOCKED


def test_protected_capacity_and_reservations_are_not_handed_out() -> None:
    ecm = account(ECM, 10, 10, protected=Resource.load(4, 0))
    assert isinstance(decide_apply(command(1, Resource.load(7, 1)), {ECM: ecm}), Refusal)
    reserved = replace(account(ECM, 10, 10), reserved=Resource.load(4, 0))
    assert isinstance(decide_apply(command(2, Resource.load(7, 1)), {ECM: reserved}), Refusal)
    assert not isinstance(decide_apply(command(3, Resource.load(6, 1)), {ECM: reserved}), Refusal)


def test_what_waiters_hold_back_refuses_with_the_label_names() -> None:
    accounts = {ECM: account(ECM, 10, 10)}
    refusal = decide_apply(command(1, Resource.load(1, 1)), accounts, {ECM: Resource.load(10, 0)})
    assert refusal == Refusal((), (ECM,))
    assert not isinstance(
        decide_apply(command(2, Resource.load(1, 1)), accounts, {ECM: Resource.load(9, 0)}),
        Refusal,
    )


def test_a_waiter_holds_only_what_it_could_ever_get_for_a_bounded_time() -> None:
    busy = replace(account(ECM, 10, 10), locked=Resource.load(6, 0), live_tickets=1)
    later = T0 + timedelta(seconds=30)
    big = Waiter(1, "bob", Resource.load(8, 1), later)
    assert held_back(busy, [big], 99, T0) == Resource.load(8, 1)  # short, could fit
    assert held_back(busy, [big], 99, later) is None  # its hold lapsed
    assert held_back(busy, [big], 1, T0) is None  # not ahead of itself
    impossible = Waiter(1, "bob", Resource.load(16, 1), later)
    assert held_back(busy, [impossible], 99, T0) is None  # can never fit: holds nothing
    fits_now = Waiter(1, "bob", Resource.load(2, 1), later)
    assert held_back(busy, [fits_now], 99, T0) == Resource.load(2, 1)  # about to be granted
    quota = replace(busy, label=USER)
    assert held_back(quota, [big], 99, T0) is None  # a user's own quota: no hold
    second = Waiter(2, "bob", Resource.load(9, 1), later)
    assert held_back(busy, [big, second], 99, T0) == Resource.load(8, 1)  # one per user


def test_report_beyond_the_lock_is_refused() -> None:
    accounts = {ECM: account(ECM, 10, 10)}
    charged, ticket = decide_apply(command(1, Resource.load(4, 4), keys=(ECM,)), accounts)  # type: ignore[misc]
    with pytest.raises(Conflict) as exc:
        decide_report(ticket, {ECM: charged[0]}, Resource.load(5, 4), T0)
    assert exc.value.reason == "USED_EXCEEDS_LOCKED"


# ----- invariants over random sequences -------------------------------------------------------

STEP = st.one_of(
    st.tuples(st.just("apply"), st.integers(0, 6), st.integers(0, 6)),
    st.tuples(st.just("report"), st.integers(0, 50), st.integers(0, 100)),
    st.tuples(st.just("release"), st.integers(0, 50), st.just(0)),
    st.tuples(st.just("tick"), st.integers(1, 40), st.just(0)),
)


def _sum(resources: list[Resource]) -> Resource:
    out = ZERO
    for r in resources:
        out = out + r
    return out


def _check(accounts: dict[str, LabelAccount], live: dict[str, Ticket]) -> None:
    for label, a in accounts.items():
        mine = [t for t in live.values() if label in t.charged_labels]
        assert all(v >= 0 for _, v in a.used.quantities + a.locked.quantities)
        assert a.locked == _sum([t.locked for t in mine])
        assert a.used == _sum([t.used for t in mine if t.used is not None])
        assert a.live_tickets == len(mine)
        assert a.max_resource is not None
        left = headroom(a.max_resource, a.used, a.locked, a.protected)
        # Admission never overcommits: locked + used + left + protected = the maximum.
        assert a.locked + a.used + left + a.protected == a.max_resource


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=60))
def test_no_sequence_overcommits_or_loses_resource(steps: list[tuple[str, int, int]]) -> None:
    accounts = {
        ECM: account(ECM, 12, 12, protected=Resource.load(2, 2)),
        USER: account(USER, 8, 20),
    }
    live: dict[str, Ticket] = {}
    now = T0
    for n, (action, x, y) in enumerate(steps):
        if action == "tick":
            now += timedelta(seconds=x)
            for ticket in [t for t in live.values() if lock_expired(t, now)]:
                updated, _ = decide_end(ticket, accounts, now, TicketState.EXPIRED, "lock timeout")
                accounts.update({a.label: a for a in updated})
                del live[ticket.ticket_id]
        elif action == "apply":
            outcome = decide_apply(command(n, Resource.load(x, y), now), accounts)
            if not isinstance(outcome, Refusal):
                charged, ticket = outcome
                accounts.update({a.label: a for a in charged})
                live[ticket.ticket_id] = ticket
        elif live:
            ticket = sorted(live.values(), key=lambda t: t.ticket_id)[x % len(live)]
            if action == "release":
                updated, _ = decide_end(ticket, accounts, now, TicketState.RELEASED, "released")
                del live[ticket.ticket_id]
            else:
                if ticket.state is not TicketState.LOCKED or lock_expired(ticket, now):
                    continue
                mem, cpu = ticket.locked.get(MEMORY), ticket.locked.get(CPU)
                used = Resource.load(mem * y // 100, cpu * y // 100)
                updated, reported, _ = decide_report(ticket, accounts, used, now)
                live[ticket.ticket_id] = reported
            accounts.update({a.label: a for a in updated})
        _check(accounts, live)


def test_a_reservation_comes_off_an_ecm_record_whatever_its_type_became() -> None:
    # An ECM's record holds the part of a demand's resource its type measures; an ECM
    # without live tickets may re-register with another type, and the reservation made
    # in the old one must still come off in full.
    demand = Resource.load(3, 2)
    held = reserve(account(ECM, 10, 10), demand)
    assert held.reserved == demand
    assert unreserve(held, demand) is None
    retyped = replace(held, max_resource=Resource.memory(10))
    assert unreserve(retyped, demand) is None
    two = reserve(held, Resource.load(1, 1))
    assert unreserve(replace(two, max_resource=Resource.memory(10)), demand) == Resource.load(1, 1)


def test_a_reservation_of_the_wrong_type_names_the_resource() -> None:
    with pytest.raises(DomainError) as err:
        reserve(account(USER, 10, 10), Resource.special({"gpu": 1}))
    assert err.value.field == "resource"
    assert err.value.message.startswith(f"does not match label {USER}: ")


# ----- more_room: when a refused allocation may fit -------------------------------------------

QTY = st.integers(0, 8)
LOAD = st.builds(Resource.load, QTY, QTY)
RESERVED = st.one_of(st.none(), LOAD)


def _account(label: str, maximum, protected, used, locked, reserved) -> LabelAccount:
    return LabelAccount(label, "limit", maximum, protected, used, locked, 0, reserved)


ACCOUNT = st.builds(
    _account, st.sampled_from([USER]), st.one_of(st.none(), LOAD), LOAD, LOAD, LOAD, RESERVED
)


def _refused(accounts: list[LabelAccount], request: Resource) -> bool:
    cmd = command(1, request, keys=tuple(a.label for a in accounts))
    return isinstance(decide_apply(cmd, {a.label: a for a in accounts}), Refusal)


def _took_more(before: LabelAccount, draw_extra) -> LabelAccount:
    """``before`` with a lower maximum and more held: no more room."""
    maximum = before.max_resource
    if maximum is not None:
        maximum = headroom(maximum, draw_extra(), ZERO, ZERO)  # never below 0
    reserved = before.reserved
    extra = draw_extra()
    if reserved is not None or not extra.is_zero():
        reserved = (reserved or ZERO) + extra
    return replace(
        before,
        max_resource=maximum,
        protected=before.protected + draw_extra(),
        used=before.used + draw_extra(),
        locked=before.locked + draw_extra(),
        reserved=reserved,
        live_tickets=before.live_tickets + 1,  # not room: ignored
    )


@given(ACCOUNT, LOAD, st.data())
@settings(max_examples=300, deadline=None)
def test_no_more_room_refuses_again(before: LabelAccount, request: Resource, data) -> None:
    """Refusal is monotone: whatever only takes more (a lower maximum, more held in any
    field) leaves no more room, and an allocation refused before is refused after."""
    after = _took_more(before, lambda: data.draw(LOAD))
    assert not more_room([before], [after])
    if _refused([before], request):
        assert _refused([after], request)


@given(ACCOUNT, st.sampled_from(["max", "protected", "used", "locked", "reserved"]), st.data())
@settings(max_examples=300, deadline=None)
def test_any_less_taken_is_more_room(before: LabelAccount, field: str, data) -> None:
    """A higher maximum, or less held in any field and dimension, may make room."""
    less = data.draw(st.sampled_from([Resource.load(1, 0), Resource.load(0, 1)]))
    if field == "max":
        if before.max_resource is None:
            return
        after = replace(before, max_resource=before.max_resource + less)
    else:
        held = getattr(before, field) or ZERO
        if not held.ge(less):
            return
        after = replace(before, **{field: held - less})
    assert more_room([before], [after])


def test_more_room_counts_what_it_cannot_compare() -> None:
    """A record come or gone, a limit lifted, another source or another resource type:
    each counts as more room (the allocation is tried again)."""
    a = _account(USER, Resource.load(4, 4), ZERO, Resource.load(4, 4), ZERO, None)
    assert more_room([a], [])
    assert more_room([a], [a, replace(a, label=ECM)])
    assert more_room([a], [replace(a, max_resource=None)])
    assert not more_room([replace(a, max_resource=None)], [a])  # a limit set: less room
    assert more_room([a], [replace(a, source="ecm")])
    assert more_room([a], [replace(a, used=Resource.special({"gpu": 1}))])
    assert not more_room([a], [a])
    assert not more_room([replace(a, reserved=ZERO)], [a])
    assert more_room([replace(a, reserved=Resource.load(1, 0))], [a])
