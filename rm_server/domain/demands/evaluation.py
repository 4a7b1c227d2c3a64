"""When a demand's time conditions hold (the language itself, its values and parser:
rm_server/domain/demands/timelang.py).

Resolution, once at submission: ``resolve`` turns NOW and relative times into instants,
an interval into a Span (or Chances, for ``^N``). Evaluation, pure: :func:`holds` answers
"may the demand be allocated at instant t after n passed-over rounds?"; :func:`may_hold`
asks whether that can still become true later, and :func:`segments` lists the time
intervals where it holds (for the planner).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from rm_server.domain.demands.timelang import (
    EPSILON,
    Absolute,
    And,
    Begin,
    Chances,
    DeadlineCondition,
    Expr,
    Interval,
    Not,
    Now,
    Or,
    Relative,
    Rounds,
    Span,
)

# ----- resolution -----------------------------------------------------------------------------


def _at(point: Begin | None, base: datetime) -> datetime | None:
    if point is None:
        return None
    if isinstance(point, Now):
        return base
    if isinstance(point, Absolute):
        return point.at
    return base + timedelta(seconds=point.seconds)


def map_atoms(expr: Expr, leaf: Callable[[Expr], Expr]) -> Expr:
    """``expr`` with every interval, span or chances replaced by ``leaf(it)``."""
    if isinstance(expr, And):
        return And(tuple(map_atoms(i, leaf) for i in expr.items))
    if isinstance(expr, Or):
        return Or(tuple(map_atoms(i, leaf) for i in expr.items))
    if isinstance(expr, Not):
        return Not(map_atoms(expr.item, leaf))
    return leaf(expr)


def resolve(expr: Expr, submitted: datetime) -> Expr:
    """Replace NOW and relative times by instants, and intervals by Span / Chances."""

    def leaf(e: Expr) -> Expr:
        if not isinstance(e, Interval):
            return e
        lo = _at(e.begin, submitted)
        if isinstance(e.end, Rounds):
            return Chances(lo, e.end.count)
        if isinstance(e.end, Relative):
            return Span(lo, (lo or submitted) + timedelta(seconds=e.end.seconds))
        return Span(lo, _at(e.end, submitted))

    return map_atoms(expr, leaf)


def deadline_at(deadline: DeadlineCondition, submitted: datetime) -> datetime:
    at = _at(deadline.point, submitted)
    assert at is not None
    return at


def estimate_rounds(expr: Expr, base: datetime, round_length: timedelta) -> Expr:
    """A time-only estimate for planning: ``^N`` lasts N + 1 rounds of ``round_length``."""

    def leaf(e: Expr) -> Expr:
        if not isinstance(e, Chances):
            return e
        return Span(e.lo, (e.lo or base) + round_length * (e.rounds + 1))

    return map_atoms(expr, leaf)


def ignore_rounds(expr: Expr) -> Expr:
    """The time extent of an expression: ``^N`` windows as if never exhausted."""
    return map_atoms(expr, lambda e: Span(e.lo, None) if isinstance(e, Chances) else e)


# ----- evaluation -----------------------------------------------------------------------------
#
# Each subtree is evaluated once, bottom up, into the set of instants where it holds: a
# sorted list of disjoint, non-adjacent closed intervals of whole microseconds (the
# resolution of time). OR merges its operands' lists (one sort), NOT complements one (a
# walk), AND is NOT(OR(NOT ...)). A subtree's list has at most two ends per interval
# below it, so a level costs O(m log m) in the intervals under it and the whole tree
# O(n log n x depth), depth at most MAX_EXPR_DEPTH. (Evaluating the whole tree once per
# breakpoint, as this module once did, was O(n^2): 4,096 intervals took a minute.)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NEG = -(1 << 62)  # no lower bound (datetime's range is about +-2**58 microseconds)
_POS = 1 << 62  # no upper bound
_Set = list[tuple[int, int]]  # sorted, disjoint, non-adjacent [lo, hi] in microseconds


def _micros(at: datetime) -> int:
    return (at - _EPOCH) // EPSILON


def _instant(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _union(items: list[tuple[int, int]]) -> _Set:
    items.sort()
    out: _Set = []
    for lo, hi in items:
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _complement(s: _Set) -> _Set:
    out: _Set = []
    cursor = _NEG
    for lo, hi in s:
        if lo > cursor:
            out.append((cursor, lo - 1))
        cursor = hi + 1
    if cursor <= _POS:
        out.append((cursor, _POS))
    return out


def _instants(expr: Expr, rounds: int) -> _Set:
    """Where a resolved expression holds after ``rounds`` passed-over rounds."""
    if isinstance(expr, Span | Chances):
        lo = _NEG if expr.lo is None else _micros(expr.lo)
        if isinstance(expr, Chances):
            return [(lo, _POS)] if rounds <= expr.rounds else []
        hi = _POS if expr.hi is None else _micros(expr.hi)
        return [(lo, hi)] if lo <= hi else []
    if isinstance(expr, Or):
        return _union([iv for item in expr.items for iv in _instants(item, rounds)])
    if isinstance(expr, And):
        gaps = [iv for item in expr.items for iv in _complement(_instants(item, rounds))]
        return _complement(_union(gaps))
    if isinstance(expr, Not):
        return _complement(_instants(expr.item, rounds))
    raise TypeError(f"resolve() the expression before evaluating it: {expr!r}")


def breakpoints(expr: Expr) -> tuple[set[datetime], set[int]]:
    """The instants and round counts at which the truth of ``expr`` may change."""
    times: set[datetime] = set()
    counts: set[int] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Span | Chances) and e.lo is not None:
            times.add(e.lo)
        if isinstance(e, Span) and e.hi is not None:
            times.add(e.hi)
        if isinstance(e, Chances):
            counts.add(e.rounds)
        if isinstance(e, And | Or):
            stack.extend(e.items)
        if isinstance(e, Not):
            stack.append(e.item)
    return times, counts


def holds(expr: Expr, at: datetime, rounds: int = 0) -> bool:
    """Whether a resolved expression allows allocation at ``at`` after ``rounds`` passes."""
    s = _instants(expr, rounds)
    t = _micros(at)
    i = bisect.bisect_right(s, (t, _POS))  # the first interval starting after t
    return i > 0 and s[i - 1][1] >= t


def may_hold(expr: Expr, at: datetime, rounds: int = 0) -> bool:
    """Whether ``expr`` holds now or at some later instant after as many or more passes.

    Passes matter only where they cross an ``^N`` (N + 1 passes close it), so ``rounds``
    and each such crossing above it are the only counts to try: at most MAX_ROUND_ENDS + 1
    evaluations."""
    t = _micros(at)
    counts = {rounds} | {n + 1 for n in breakpoints(expr)[1] if n >= rounds}
    for n in sorted(counts):
        s = _instants(expr, n)
        if s and s[-1][1] >= t:
            return True
    return False


def segments(expr: Expr, since: datetime) -> list[tuple[datetime, datetime | None]]:
    """The maximal intervals ``[a, b]`` (b None: unbounded) of [since, inf) where a
    time-only expression holds (use estimate_rounds or ignore_rounds first)."""
    floor = _micros(since)
    out: list[tuple[datetime, datetime | None]] = []
    for lo, hi in _instants(expr, 0):
        if hi < floor:
            continue
        a = since if lo <= floor else _instant(lo)
        out.append((a, None if hi >= _POS else _instant(hi)))
    return out


def last_instant(expr: Expr, since: datetime) -> datetime | None:
    """The last instant >= since at which a time-only expression holds; None if unbounded
    (or if it never holds: check ``segments`` first)."""
    segs = segments(expr, since)
    return segs[-1][1] if segs else None
