"""OrderBy waits, pure: what a demand waits for, its text, and the ORDER_BY_MISSING bound."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.demands.planner import (
    Action,
    DemandView,
    PlannerSettings,
    decide,
    order_bound,
)
from rm_server.domain.demands.state import DemandState
from rm_server.domain.demands.timelang import (
    AllOf,
    AnyOf,
    DemandRef,
    OrderBy,
    Span,
    Strategy,
    order_value,
)
from rm_server.domain.demands.waits import (
    Predecessor,
    finished_of,
    needed_missing,
    order_wait,
    wait_text,
)

T = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
SET = PlannerSettings(round_length=timedelta(seconds=10), order_by_timeout=timedelta(hours=1))
S = DemandState


def view(order: OrderBy, window: Span | None = None, loose: bool = False) -> DemandView:
    strategy = Strategy.LOOSE if loose else Strategy.STRICT
    return DemandView(S.ACCEPTED, window or Span(T, None), strategy, T, T, order=order)


def test_the_bound_is_the_window_end_else_the_operator_default():
    a = DemandRef("a")
    assert order_bound(view(a), SET) == T + timedelta(hours=1)
    window = Span(T, T + timedelta(minutes=5))
    assert order_bound(view(a, window), SET) == T + timedelta(minutes=5)
    assert order_bound(view(a, window, loose=True), SET) == T + timedelta(minutes=20)


def test_missing_counts_only_when_the_order_needs_it():
    either = AnyOf((DemandRef("a"), DemandRef("b")))
    assert needed_missing(either, {"a": None, "b": S.ACCEPTED}) == ()
    assert needed_missing(either, {"a": None, "b": S.FAILED}) == ("a",)
    both = AllOf((DemandRef("a"), DemandRef("b")))
    assert needed_missing(both, {"a": None, "b": S.ACCEPTED}) == ("a",)


def test_the_wait_in_words():
    order = AllOf((DemandRef("c-000"), DemandRef("etl"), DemandRef("done")))
    named = {
        "etl": Predecessor("etl", S.MONITORING, T + timedelta(minutes=42)),
        "done": Predecessor("done", S.FINISHED),
    }
    wait = order_wait(order, named, T + timedelta(hours=1))
    assert wait_text(wait) == (
        "waiting for c-000: not submitted; etl: MONITORING, planned end 2026-01-01T10:42:00Z"
        " (ORDER_BY_MISSING after 2026-01-01T11:00:00Z)"
    )
    satisfied = {"c-000": Predecessor("c-000", S.FINISHED), **named}
    assert order_wait(DemandRef("done"), satisfied, T) is None
    assert wait_text(order_wait(None, {}, T)) == ""


orders = st.recursive(
    st.sampled_from(["a", "b", "c"]).map(DemandRef),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AllOf(tuple(xs))),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AnyOf(tuple(xs))),
    ),
    max_leaves=6,
)
states = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from([None, S.ACCEPTED, S.MONITORING, S.FINISHED, S.FAILED]),
)


@given(orders, states, st.integers(-120, 120))
def test_order_by_missing_only_past_the_bound_and_only_when_needed(order, named, minutes):
    """The demand fails with ORDER_BY_MISSING exactly when the bound has passed and its
    OrderBy, still pending, could only hold with a demand not submitted yet."""
    now = T + timedelta(hours=1, minutes=minutes)
    full = {i: named.get(i) for i in ("a", "b", "c")}
    missing = {i for i, s in full.items() if s is None}
    decision = decide(view(order), now, SET, finished_of(full), missing=missing)
    expected = bool(needed_missing(order, full)) and now > T + timedelta(hours=1)
    failed_missing = decision.action is Action.FAIL and "ORDER_BY_MISSING" in decision.reason
    if order_value(order, finished_of(full)) is False:
        assert not failed_missing  # it fails for the FAILED one instead
    else:
        assert failed_missing == expected
