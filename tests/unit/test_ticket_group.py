"""The decision of a group of ticket requests (rm_server/domain/ticket_group.py), without
I/O: every request ends with a value (a ticket, a refusal, labels needing a record, or the
domain's error), a group decides as its requests would one after the other, and a request
that is refused leaves the state as it found it. The domain's errors and refusals become
the RM's in one place (rm_server/errors.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from labelrm_common.quantity import Shortfall
from rm_server.domain.errors import (
    Conflict,
    DomainError,
    EcmNotRegistered,
    EcmNotRunning,
    OverCapacity,
    Unknown,
)
from rm_server.domain.labels import Label
from rm_server.domain.ledger import ApplyCommand, LabelAccount, Waiter
from rm_server.domain.model import Refusal, Ticket, TicketState
from rm_server.domain.resources import Resource
from rm_server.domain.ticket_group import (
    Command,
    ExpireCommand,
    GroupView,
    NeedsRows,
    ReleaseCommand,
    ReportCommand,
    decide_group,
)
from rm_server.errors import (
    EcmNotRegistered as RmEcmNotRegistered,
)
from rm_server.errors import (
    EcmNotRunning as RmEcmNotRunning,
)
from rm_server.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    as_rm_error,
    refused,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ECM = "emInstance=host1:9000"
USER = "engineType=spark,userCreator=alice-IDE"
ZERO = Resource.load(0, 0)


def account(label: str, memory: int, cpu: int) -> LabelAccount:
    source = "ecm" if label == ECM else "limit"
    return LabelAccount(
        label, source, Resource.load(memory, cpu), ZERO, ZERO, ZERO, 0, ecm_state="RUNNING"
    )


def apply(n: int, memory: int, keys=(ECM, USER), *, seq: int | None = None) -> ApplyCommand:
    return ApplyCommand(
        ticket_id=f"t{n}",
        user="alice",
        labels=(Label("userCreator", "alice-IDE"),),
        keys=keys,
        resource=Resource.load(memory, 1),
        now=T0,
        lock_expires_at=T0 + timedelta(seconds=60),
        waiter_seq=seq,
    )


def view(accounts=None, tickets=None, need=(), history=None, waiters=None) -> GroupView:
    accounts = (
        accounts if accounts is not None else {ECM: account(ECM, 8, 8), USER: account(USER, 8, 8)}
    )
    return GroupView(accounts, waiters or {}, tickets or {}, frozenset(need), history or {})


def test_every_outcome_is_a_value_and_a_refused_request_changes_nothing() -> None:
    decision = decide_group(
        [
            apply(1, 6),  # fits
            apply(2, 6),  # does not fit after the first: a Refusal, nothing charged
            apply(3, 2, keys=(ECM, USER, "userCreator=bob-IDE,engineType=spark")),
            ReportCommand("t-nope", None),
            ReleaseCommand("t-nope"),
            apply(4, 2),  # fits beside the first
        ],
        view(need=("userCreator=bob-IDE,engineType=spark",)),
        T0,
    )
    first, short, needs, unknown_report, unknown_release, last = decision.outcomes
    assert isinstance(first, Ticket) and first.state is TicketState.LOCKED
    assert isinstance(short, Refusal) and [s.label for s in short.shortfalls] == [ECM, USER]
    assert needs == NeedsRows(("userCreator=bob-IDE,engineType=spark",))
    assert isinstance(unknown_report, Unknown) and isinstance(unknown_release, Unknown)
    assert isinstance(last, Ticket)
    state = decision.state
    assert state.accounts[ECM].locked == Resource.load(8, 2)
    assert state.accounts[ECM].live_tickets == 2
    assert set(state.tickets) == {"t1", "t4"}


def test_a_report_past_the_lock_expires_the_ticket_and_is_refused() -> None:
    """The refusal settles the request: the expiry it found stands."""
    charged = decide_group([apply(1, 4)], view(), T0)
    (ticket,) = charged.outcomes
    assert isinstance(ticket, Ticket)
    later = T0 + timedelta(seconds=61)
    decision = decide_group(
        [ReportCommand("t1", None), ReleaseCommand("t1")],
        view(charged.state.accounts, {"t1": ticket}),
        later,
    )
    report, release = decision.outcomes
    assert isinstance(report, Conflict) and report.reason == "LOCK_EXPIRED" and report.settles
    assert isinstance(release, Ticket) and release.state is TicketState.EXPIRED  # as it ended
    assert decision.state.accounts[ECM].locked == ZERO
    assert [ended.state for _, ended in decision.state.history] == [TicketState.EXPIRED]


def test_a_transient_refusal_is_undone() -> None:
    """An ECM that is LOST refuses the apply (transient: it may beat again)."""
    lost = {
        ECM: LabelAccount(ECM, "ecm", Resource.load(8, 8), ZERO, ZERO, ZERO, 0, ecm_state="LOST")
    }
    decision = decide_group([apply(1, 1, keys=(ECM,))], view(lost), T0)
    (outcome,) = decision.outcomes
    assert isinstance(outcome, EcmNotRunning) and not outcome.settles
    assert decision.state.accounts == lost and decision.state.tickets == {}


def test_a_served_waiter_leaves_the_queue_of_every_label() -> None:
    waiting = Waiter(7, "alice", Resource.load(4, 1), T0 + timedelta(seconds=30))
    decision = decide_group(
        [apply(1, 4, seq=7)], view(waiters={ECM: (waiting,), USER: (waiting,)}), T0
    )
    assert isinstance(decision.outcomes[0], Ticket)
    assert decision.state.waiters == {ECM: (), USER: ()}
    assert decision.state.waiters_served == [7]


STEP = st.one_of(
    st.tuples(st.just("apply"), st.integers(0, 9)),
    st.tuples(st.just("report"), st.integers(0, 20)),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("expire"), st.integers(0, 20)),
)


def _commands(steps: list[tuple[str, int]]) -> list[Command]:
    out: list[Command] = []
    for n, (kind, x) in enumerate(steps):
        if kind == "apply":
            out.append(apply(n, x))
        elif kind == "report":
            out.append(ReportCommand(f"t{x}", None))
        elif kind == "release":
            out.append(ReleaseCommand(f"t{x}"))
        else:
            out.append(ExpireCommand(f"t{x}"))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(STEP, max_size=25))
def test_a_group_decides_as_its_requests_would_one_after_the_other(steps) -> None:
    commands = _commands(steps)
    together = decide_group(commands, view(), T0 + timedelta(seconds=90))
    accounts = dict(view().accounts)
    tickets: dict[str, Ticket] = {}
    history: dict[str, Ticket] = {}
    alone = []
    for command in commands:
        one = decide_group(
            [command], view(accounts, tickets, history=history), T0 + timedelta(seconds=90)
        )
        alone.append(one.outcomes[0])
        accounts = one.state.accounts
        tickets = {t: k for t, k in one.state.tickets.items() if k is not None}
        history.update(one.state.ended)
    assert [_kind(o) for o in together.outcomes] == [_kind(o) for o in alone]
    assert together.state.accounts == accounts
    assert {t: k for t, k in together.state.tickets.items() if k is not None} == tickets


def _kind(outcome) -> object:
    if isinstance(outcome, DomainError):
        return (type(outcome), outcome.message)
    return outcome


def test_the_domain_errors_and_refusals_become_the_rms_in_one_place() -> None:
    short = Shortfall(USER, "memory_bytes", 4, 1)
    cases = [
        (DomainError("bad", "used_resource"), InvalidArgument, "INVALID_ARGUMENT"),
        (
            DomainError("reused", "request_id", reason="REQUEST_ID_REUSED"),
            InvalidArgument,
            "REQUEST_ID_REUSED",
        ),
        (Unknown("ticket t1 not found"), NotFound, "NOT_FOUND"),
        (EcmNotRegistered("ECM x is not registered"), RmEcmNotRegistered, "ECM_NOT_REGISTERED"),
        (EcmNotRunning("ECM x is LOST", state="LOST"), RmEcmNotRunning, "ECM_NOT_RUNNING"),
        (
            Conflict("ended", state="RELEASED", reason="TICKET_ENDED"),
            FailedPrecondition,
            "TICKET_ENDED",
        ),
        (
            OverCapacity("insufficient resource", [short]),
            ResourceExhausted,
            "INSUFFICIENT_RESOURCE",
        ),
    ]
    for domain_error, rm_class, reason in cases:
        err = as_rm_error(domain_error)
        assert err is not None and type(err) is rm_class and err.reason == reason
        assert err.message.endswith(domain_error.message)
    ended = as_rm_error(Conflict("ended", state="RELEASED", reason="TICKET_ENDED"))
    assert isinstance(ended, FailedPrecondition) and ended.state == "RELEASED"
    assert not ended.transient
    lost = as_rm_error(EcmNotRunning("ECM x is LOST", state="LOST"))
    assert isinstance(lost, FailedPrecondition) and lost.transient and lost.state == "LOST"
    assert as_rm_error(DomainError("a value nobody named")) is None  # a bug: INTERNAL
    exhausted = refused(Refusal((short,), detail="YARN queue root.a"))
    assert exhausted.reason == "INSUFFICIENT_RESOURCE" and exhausted.shortfalls == (short,)
    assert exhausted.message == "insufficient resource (YARN queue root.a)"
    behind = refused(Refusal((), (ECM,)))
    assert behind.reason == "QUEUED_BEHIND_WAITERS" and ECM in behind.message
