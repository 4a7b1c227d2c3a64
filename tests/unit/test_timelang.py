"""The time-condition language: parsing (text and errors), resolution, evaluation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.demands import codec
from rm_server.domain.demands.evaluation import (
    estimate_rounds,
    holds,
    ignore_rounds,
    last_instant,
    may_hold,
    resolve,
    segments,
)
from rm_server.domain.demands.syntax import TimeLangError
from rm_server.domain.demands.timelang import (
    DEMAND_ID_RE,
    Absolute,
    AllOf,
    And,
    AnyOf,
    Chances,
    Conditions,
    DeadlineCondition,
    DemandRef,
    DurationCondition,
    Interval,
    Not,
    Now,
    Or,
    Relative,
    Rounds,
    Span,
    Strategy,
    TimeCondition,
    order_value,
    parse,
)

S = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)  # the submission instant in these tests


def at(minutes: float) -> datetime:
    return S + timedelta(minutes=minutes)


# ----- the paper's examples ---------------------------------------------------------------------


def test_the_papers_example_demand_1234_after_1200_within_20_minutes():
    c = parse("{DemandID: 1234, OrderBy: 1200, Duration: {Time: [NOW, +20m], Strategy: loose}}")
    assert c == Conditions(
        demand_id="1234",
        order_by=DemandRef("1200"),
        duration=DurationCondition(1200, Strategy.LOOSE),
    )


def test_the_papers_or_of_five_minutes_or_three_rounds():
    c = parse("Time: { OR: [ [NOW, +5m], [NOW, ^3] ] }")
    assert c.start == TimeCondition(
        Or((Interval(Now(), Relative(300)), Interval(Now(), Rounds(3)))), Strategy.STRICT
    )
    expr = resolve(c.start.expr, S)
    assert holds(expr, at(4), rounds=10)  # inside the 5 minutes, however often passed over
    assert holds(expr, at(60), rounds=3)  # after them, while at most 3 rounds passed
    assert not holds(expr, at(60), rounds=4)
    assert not may_hold(expr, at(60), rounds=4)  # closed for good


def test_strict_json_and_the_unquoted_style_mean_the_same():
    paper = "{Start: {Time: [26-01-01 12:00:00, +2h], Strategy: loose}, OrderBy: [a, b]}"
    json_text = (
        '{"Start": {"Time": ["2026-01-01T12:00:00Z", "+2h"], "Strategy": "loose"},'
        ' "OrderBy": ["a", "b"]}'
    )
    assert parse(paper) == parse(json_text)
    assert parse(paper).order_by == AllOf((DemandRef("a"), DemandRef("b")))


def test_top_level_without_braces_and_case_insensitive_names():
    assert parse("demandid: x, ORDERBY: {or: [a, b]}") == Conditions(
        demand_id="x", order_by=AnyOf((DemandRef("a"), DemandRef("b")))
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("26-01-01 12:00:00", datetime(2026, 1, 1, 12, tzinfo=UTC)),
        ("2026-01-01 12:00", datetime(2026, 1, 1, 12, tzinfo=UTC)),
        ("2026-1-2", datetime(2026, 1, 2, tzinfo=UTC)),
        ("2026-01-01T12:00:00Z", datetime(2026, 1, 1, 12, tzinfo=UTC)),
        ("2026-01-01T12:00:00.5+02:00", datetime(2026, 1, 1, 10, 0, 0, 500000, tzinfo=UTC)),
        ('"2026-01-01T12:00:00-0130"', datetime(2026, 1, 1, 13, 30, tzinfo=UTC)),
    ],
)
def test_absolute_times(text, expected):
    c = parse(f"{{Start: [{text}, ]}}")
    assert c.start is not None
    assert c.start.expr == Interval(Absolute(expected), None)


def test_relative_times_and_open_ends_resolve_against_submission_and_t1():
    c = parse("{Start: [+1h, +30m]}")
    assert c.start is not None
    assert resolve(c.start.expr, S) == Span(at(60), at(90))  # T2 is relative to T1
    assert resolve(parse("{Start: [, +1h30m]}").start.expr, S) == Span(None, at(90))  # type: ignore[union-attr]
    assert resolve(parse("{Start: [NOW, ]}").start.expr, S) == Span(S, None)  # type: ignore[union-attr]
    assert resolve(parse("{Start: []}").start.expr, S) == Span(None, None)  # type: ignore[union-attr]
    assert resolve(parse("{Start: [null, null]}").start.expr, S) == Span(None, None)  # type: ignore[union-attr]


def test_duration_and_deadline_forms():
    for text in ("+20m", "20m", '"20m"', "{Time: +20m}", "{Time: [NOW, +20m]}"):
        assert parse(f"{{Duration: {text}}}").duration == DurationCondition(1200)
    span = "{Duration: {Time: [2026-01-01 12:00, 2026-01-01 13:30], Strategy: strict}}"
    assert parse(span).duration == DurationCondition(5400, Strategy.STRICT)
    assert parse("{DeadLine: +2h}").deadline == DeadlineCondition(Relative(7200))
    assert parse("{Deadline: {Time: [NOW, +2h], Strategy: strict}}").deadline == (
        DeadlineCondition(Relative(7200), Strategy.STRICT)
    )


# ----- malformed input: position and what was expected ----------------------------------------

MALFORMED = [
    ("{Start: [NOW +5m]}", 1, 14, "',' or ']'"),
    ("{Start: [^3, NOW]}", 1, 10, "^N is only allowed as the end T2"),
    ("{Start: [NOW, +5x]}", 1, 15, "a relative time such as"),
    ("{Start: [NOW, tomorrow]}", 1, 15, "a time: NOW, +5m"),
    ("{Start: [26-13-01, ]}", 1, 10, "month must be in 1..12"),
    ("{Start: [NOW]}", 1, 13, "the end time T2"),
    ("{Start: [NOW, +1m, +2m]}", 1, 20, "an interval has two ends"),
    ("{Start: [2026-01-02, 2026-01-01]}", 1, 22, "an end at or after the start"),
    ("{Start: {Time: [NOW, +5m], Strat: loose}}", 1, 28, "one of Time, Strategy"),
    ("{Start: {Time: [NOW, +5m], Strategy: lazy}}", 1, 38, "strict or loose"),
    ("{Start: {Time: [[NOW, +5m], [NOW, ^3]]}}", 1, 16, "combine intervals with AND or OR"),
    ("{Start: {OR: []}}", 1, 14, "a non-empty array"),
    ("{Start: {AND: [[NOW, +1m]], OR: [[NOW, +1m]]}}", 1, 29, "one operator"),
    ("{Start: [NOW, +5m]", 1, 19, "',' or '}'"),
    ('{Start: ["NOW, +5m]}', 1, 10, 'a closing "'),
    ("{Start [NOW, +5m]}", 1, 8, "':' after the field name"),
    ("{OrderBy: {NOT: 1200}}", 1, 12, "OrderBy waits for demands to finish"),
    ("{OrderBy: [+5m]}", 1, 12, "a demand id"),
    ("{Duration: [NOW, ^3]}", 1, 12, "a duration"),
    ("{DeadLine: ^3}", 1, 12, "a time"),
    ("{Start: [NOW, +1m], Time: [NOW, +1m]}", 1, 21, "Time inside Start"),
    ("{Start: [NOW, +1m], start: [NOW, +2m]}", 1, 21, "Start only once"),
    ("{Start: [NOW, +1m]} trailing", 1, 21, "the end of the conditions"),
    ("{Colour: red}", 1, 2, "a field name: one of DemandID, Start"),
    ("", 1, 1, "an object"),
    ("{DemandID: 12,\n OrderBy: [a, b],\n  Start: [NOW, later]}", 3, 16, "a time"),
]


@pytest.mark.parametrize(("text", "line", "column", "expected"), MALFORMED)
def test_malformed_input_names_the_position_and_what_was_expected(text, line, column, expected):
    with pytest.raises(TimeLangError) as err:
        parse(text)
    e = err.value
    assert (e.line, e.column) == (line, column), e.message
    assert expected in e.message
    assert e.message.startswith(f"line {line}, column {column} (offset {e.offset}): expected")
    lines = text.split("\n")
    assert sum(len(x) + 1 for x in lines[: line - 1]) + column - 1 == e.offset


def test_hostile_nesting_is_refused_not_a_crash():
    deep = "{Start: " + "{NOT: " * 100 + "[]" + "}" * 100 + "}"
    with pytest.raises(TimeLangError, match="levels of nesting"):
        parse(deep)


# ----- evaluation -------------------------------------------------------------------------------


def test_not_and_segments():
    expr = resolve(parse("{Start: {NOT: [NOW, +5m]}}").start.expr, S)  # type: ignore[union-attr]
    assert not holds(expr, at(2))
    assert holds(expr, at(6))
    segs = segments(expr, S)
    assert segs == [(at(5) + timedelta(microseconds=1), None)]
    window = resolve(parse("{Start: {OR: [[NOW, +5m], [+1h, +5m]]}}").start.expr, S)  # type: ignore[union-attr]
    assert segments(window, S) == [(S, at(5)), (at(60), at(65))]
    assert last_instant(window, S) == at(65)


def test_rounds_estimates_for_planning():
    expr = resolve(Interval(Now(), Rounds(3)), S)
    assert expr == Chances(S, 3)
    assert estimate_rounds(expr, S, timedelta(seconds=10)) == Span(S, S + timedelta(seconds=40))
    assert ignore_rounds(expr) == Span(S, None)


def test_order_by_is_three_valued():
    order = AllOf((DemandRef("a"), AnyOf((DemandRef("b"), DemandRef("c")))))
    assert order_value(order, {}) is None
    assert order_value(order, {"a": True, "b": False}) is None
    assert order_value(order, {"a": True, "c": True}) is True
    assert order_value(order, {"a": True, "b": False, "c": False}) is False
    assert order_value(order, {"a": False}) is False


# ----- properties -------------------------------------------------------------------------------

instants = st.integers(min_value=-120, max_value=240).map(lambda m: at(m))
maybe = st.one_of(st.none(), instants)
atoms = st.one_of(
    st.builds(Span, maybe, maybe),
    st.builds(Chances, maybe, st.integers(min_value=0, max_value=5)),
)
exprs = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: And(tuple(xs))),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: Or(tuple(xs))),
        inner.map(Not),
    ),
    max_leaves=8,
)
probe_times = st.integers(min_value=-200, max_value=300).map(lambda s: at(s) + timedelta(seconds=s))
probe_rounds = st.integers(min_value=0, max_value=8)


@given(exprs, probe_times, probe_rounds)
def test_not_not_is_identity(x, t, n):
    assert holds(Not(Not(x)), t, n) == holds(x, t, n)


@given(exprs, exprs, probe_times, probe_rounds)
def test_and_or_commute(x, y, t, n):
    assert holds(And((x, y)), t, n) == holds(And((y, x)), t, n)
    assert holds(Or((x, y)), t, n) == holds(Or((y, x)), t, n)


@given(exprs, probe_times, probe_rounds)
def test_what_holds_may_hold(x, t, n):
    if holds(x, t, n):
        assert may_hold(x, t, n)


@given(exprs, probe_times, probe_rounds, st.integers(min_value=0, max_value=400))
def test_may_hold_is_exact_when_something_later_holds(x, t, n, later):
    if holds(x, t + timedelta(minutes=later), n):
        assert may_hold(x, t, n)


@given(exprs, probe_times, instants)
def test_segments_agree_with_holds(x, t, since):
    timed = ignore_rounds(x)
    inside = any(a <= t and (b is None or t <= b) for a, b in segments(timed, since))
    assert inside == (t >= since and holds(timed, t))


# Generated conditions survive both codecs.
offsets = st.integers(min_value=0, max_value=366 * 86400)
absolutes = st.datetimes(
    min_value=datetime(2001, 1, 1), max_value=datetime(2099, 1, 1), timezones=st.just(UTC)
).map(Absolute)
begins = st.one_of(st.none(), st.just(Now()), absolutes, offsets.map(Relative))
ends = st.one_of(begins, st.integers(min_value=0, max_value=1000).map(Rounds))
intervals = st.builds(Interval, begins, ends).filter(
    lambda i: (
        not (
            isinstance(i.begin, Absolute) and isinstance(i.end, Absolute) and i.end.at < i.begin.at
        )
    )
)
written = st.recursive(
    intervals,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: And(tuple(xs))),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: Or(tuple(xs))),
        inner.map(Not),
    ),
    max_leaves=6,
)
strategies = st.sampled_from(list(Strategy))
ids = st.from_regex(DEMAND_ID_RE, fullmatch=True)
orders = st.recursive(
    ids.map(DemandRef),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AllOf(tuple(xs))),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: AnyOf(tuple(xs))),
    ),
    max_leaves=5,
)
conditions = st.builds(
    Conditions,
    st.one_of(st.none(), ids),
    st.one_of(st.none(), st.builds(TimeCondition, written, strategies)),
    st.one_of(st.none(), st.builds(DurationCondition, offsets, strategies)),
    st.one_of(
        st.none(),
        st.builds(
            DeadlineCondition,
            st.one_of(st.just(Now()), absolutes, offsets.map(Relative)),
            strategies,
        ),
    ),
    st.one_of(st.none(), orders),
)


@given(conditions)
def test_text_and_json_round_trips(c):
    assert codec.from_json(codec.to_json(c)) == c
    assert parse(codec.format_text(c)) == c


def test_every_worked_example_in_the_docs_parses():
    """docs/demands.md is the user's guide: its examples must be valid conditions."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "demands.md").read_text()
    section = doc.split("### Worked examples", 1)[1].split("## How the RM plans", 1)[0]
    examples = re.findall(r"^\| `(.+?)` \|", section, re.MULTILINE)
    examples += re.findall(r"--when '(.+?)'", doc)
    assert len(examples) >= 10
    for text in examples:
        parse(text)
