"""The time language's cost is bounded: explicit limits on a start window (intervals, ^N
ends, nesting), and an evaluation that equals the language's meaning, checked here
against a reference evaluator that follows the definition literally (evaluate the whole
tree at one instant in every cell the breakpoints cut time into: quadratic, so only
for small trees, and only here)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rm_server.domain.demands.evaluation import (
    holds,
    last_instant,
    map_atoms,
    may_hold,
    resolve,
    segments,
)
from rm_server.domain.demands.syntax import MAX_TEXT, TimeLangError
from rm_server.domain.demands.timelang import (
    MAX_EXPR_DEPTH,
    MAX_INTERVALS,
    MAX_ROUND_ENDS,
    And,
    Chances,
    Expr,
    Not,
    Or,
    Span,
    parse,
)

S = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TICK = timedelta(microseconds=1)


# ----- the reference: the meaning, literally ---------------------------------------------------


def ref_holds(e: Expr, at: datetime, rounds: int) -> bool:
    if isinstance(e, Span):
        return (e.lo is None or e.lo <= at) and (e.hi is None or at <= e.hi)
    if isinstance(e, Chances):
        return (e.lo is None or e.lo <= at) and rounds <= e.rounds
    if isinstance(e, And):
        return all(ref_holds(i, at, rounds) for i in e.items)
    if isinstance(e, Or):
        return any(ref_holds(i, at, rounds) for i in e.items)
    assert isinstance(e, Not)
    return not ref_holds(e.item, at, rounds)


def ref_breakpoints(e: Expr) -> tuple[set[datetime], set[int]]:
    times: set[datetime] = set()
    counts: set[int] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Span | Chances) and x.lo is not None:
            times.add(x.lo)
        if isinstance(x, Span) and x.hi is not None:
            times.add(x.hi)
        if isinstance(x, Chances):
            counts.add(x.rounds)
        if isinstance(x, And | Or):
            stack.extend(x.items)
        if isinstance(x, Not):
            stack.append(x.item)
    return times, counts


def ref_cells(times: set[datetime], since: datetime) -> list[tuple[datetime, datetime | None]]:
    """[since, inf) cut at every breakpoint: each breakpoint a cell of its own."""
    cells: list[tuple[datetime, datetime | None]] = []
    cursor = since
    for t in sorted(t for t in times if t >= since):
        if cursor < t:
            cells.append((cursor, t - TICK))
        cells.append((t, t))
        cursor = t + TICK
    cells.append((cursor, None))
    return cells


def ref_may_hold(e: Expr, at: datetime, rounds: int) -> bool:
    times, counts = ref_breakpoints(e)
    tries = {rounds} | {c + 1 for c in counts if c >= rounds}
    return any(ref_holds(e, a, n) for a, _ in ref_cells(times, at) for n in tries)


def ref_segments(e: Expr, since: datetime) -> list[tuple[datetime, datetime | None]]:
    out: list[tuple[datetime, datetime | None]] = []
    for a, b in ref_cells(ref_breakpoints(e)[0], since):
        if not ref_holds(e, a, 0):
            continue
        if out and out[-1][1] is not None and out[-1][1] + TICK == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


# ----- random small trees: the evaluation equals the reference ---------------------------------

# Instants on a coarse grid (so that ends meet, touch and coincide) and a microsecond off
# it (so that adjacency at the resolution of time is exercised).
grid = st.integers(min_value=-20, max_value=40).map(lambda m: S + timedelta(minutes=m))
instants = st.one_of(grid, grid.map(lambda t: t + TICK), grid.map(lambda t: t - TICK))
maybe = st.one_of(st.none(), instants)
atoms = st.one_of(
    st.builds(Span, maybe, maybe),
    st.builds(Chances, maybe, st.integers(min_value=0, max_value=4)),
)
trees = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=4).map(lambda xs: And(tuple(xs))),
        st.lists(inner, min_size=1, max_size=4).map(lambda xs: Or(tuple(xs))),
        inner.map(Not),
    ),
    max_leaves=12,
)
probe = st.one_of(instants, st.integers(-30, 50).map(lambda m: S + timedelta(minutes=m, seconds=7)))
rounds = st.integers(min_value=0, max_value=6)


def time_only(e: Expr) -> Expr:
    """``e`` with every ^N as an open-ended span (what the planner evaluates)."""
    if isinstance(e, Chances):
        return Span(e.lo, None)
    if isinstance(e, And):
        return And(tuple(time_only(i) for i in e.items))
    if isinstance(e, Or):
        return Or(tuple(time_only(i) for i in e.items))
    if isinstance(e, Not):
        return Not(time_only(e.item))
    return e


@settings(max_examples=400)
@given(trees, probe, rounds)
def test_holds_equals_the_reference(e, t, n):
    assert holds(e, t, n) == ref_holds(e, t, n)


@settings(max_examples=400)
@given(trees, probe, rounds)
def test_may_hold_equals_the_reference(e, t, n):
    assert may_hold(e, t, n) == ref_may_hold(e, t, n)


@settings(max_examples=400)
@given(trees, probe)
def test_segments_and_last_instant_equal_the_reference(e, since):
    e = time_only(e)
    expected = ref_segments(e, since)
    assert segments(e, since) == expected
    assert last_instant(e, since) == (expected[-1][1] if expected else None)


# ----- the limits: refused while reading, naming the limit ---------------------------------------


def window(n: int, per_group: int = 64, interval: str = "[+{k}m, +1m]") -> str:
    """A start window of ``n`` intervals in nested ORs of ``per_group`` (as an attacker
    would write it to stay inside 64 operands per OR)."""
    spans = [interval.format(k=2 * k) for k in range(n)]
    groups = [spans[i : i + per_group] for i in range(0, n, per_group)]
    inner = ", ".join("{OR: [" + ", ".join(g) + "]}" for g in groups)
    return "{Start: {OR: [" + inner + "]}}"


class Watched(Span):
    """A resolved span that counts, in ``reads``, how often its ends are read (by
    whatever evaluates it): the work an evaluation does per interval, counted, not timed."""

    reads: Counter[int] = Counter()

    def __getattribute__(self, name: str):
        if name in ("lo", "hi"):
            Watched.reads[id(self)] += 1
        return object.__getattribute__(self, name)


def watched(e: Expr) -> Expr:
    assert isinstance(e, Span)
    return Watched(e.lo, e.hi)


def reads_per_interval(evaluate) -> Counter[int]:
    Watched.reads = Counter()
    evaluate()
    return Watched.reads


# Each interval's two ends read at most twice each per evaluation pass (and may_hold's
# breakpoint walk is one more pass): a constant per interval, whatever the window's size.
# Evaluating the whole tree once per breakpoint, as this module once did (quadratic), reads
# every interval in each of the 2n + 1 cells: the reference above reads each one 530 to
# 4,100 times for the largest window.
READS_PER_PASS = 4


def test_the_largest_window_the_limits_allow_is_read_and_evaluated_in_linear_work():
    c = parse(window(MAX_INTERVALS))
    assert c.start is not None
    expr = map_atoms(resolve(c.start.expr, S), watched)

    passes = {
        "segments": (lambda: segments(expr, S), 1),
        "holds": (lambda: holds(expr, S), 1),
        "may_hold": (lambda: may_hold(expr, S), 2),  # the breakpoints, then one evaluation
    }
    for name, (evaluate, n) in passes.items():
        reads = reads_per_interval(evaluate)
        assert len(reads) == MAX_INTERVALS, name  # every interval was looked at
        assert max(reads.values()) <= n * READS_PER_PASS, (name, max(reads.values()))

    assert len(segments(expr, S)) == MAX_INTERVALS
    assert may_hold(expr, S) and holds(expr, S)


def test_one_interval_too_many_is_refused_naming_the_limit():
    with pytest.raises(TimeLangError) as err:
        parse(window(MAX_INTERVALS + 1))
    assert f"at most {MAX_INTERVALS} intervals in a start window" in err.value.message
    assert "interval limit" in err.value.message
    assert f"found interval number {MAX_INTERVALS + 1}" in err.value.message


def test_the_observed_attack_of_4096_intervals_is_refused_at_its_257th():
    text = window(4096)
    assert len(text) < MAX_TEXT  # inside every limit the language had before
    with pytest.raises(TimeLangError) as err:
        parse(text)
    assert f"found interval number {MAX_INTERVALS + 1}" in err.value.message


def test_too_many_round_ends_are_refused():
    parse(window(MAX_ROUND_ENDS, interval="[NOW, ^{k}]"))
    with pytest.raises(TimeLangError) as err:
        parse(window(MAX_ROUND_ENDS + 1, interval="[NOW, ^{k}]"))
    assert f"at most {MAX_ROUND_ENDS} ^N ends" in err.value.message


def test_nesting_deeper_than_the_limit_is_refused():
    def nested(levels: int) -> str:
        return "{Start: " + "{NOT: " * levels + "[NOW, +1m]" + "}" * levels + "}"

    parse(nested(MAX_EXPR_DEPTH))
    with pytest.raises(TimeLangError) as err:
        parse(nested(MAX_EXPR_DEPTH + 1))
    assert f"at most {MAX_EXPR_DEPTH} levels of AND/OR/NOT nesting" in err.value.message
    assert f"found an operator at level {MAX_EXPR_DEPTH + 1}" in err.value.message


def test_text_beyond_the_size_limit_is_refused_before_it_is_read():
    with pytest.raises(TimeLangError) as err:
        parse("{Start: [NOW, +1m]}" + " " * MAX_TEXT)
    assert f"at most {MAX_TEXT} characters" in err.value.message
