"""The time-condition language of Wang Jian's paper on extending Hadoop YARN resource
requests and allocation with time factors: what conditions mean, and when they hold.

A demand's conditions (see docs/demands.md for the user's guide)::

    {
      DemandID: 1234,                                   # optional; must match the demand id
      Start:    {Time: EXPR, Strategy: strict | loose}, # when it may be allocated
      Duration: {Time: +20m, Strategy: loose},          # how long it expects to hold it
      DeadLine: {Time: "2026-01-01 12:00:00"},          # when its work must be done
      OrderBy:  1200 | [1200, 1201] | {OR: [1200, 1201]}  # allocate after these FINISH
    }

    EXPR  := [T1, T2] | {AND: [EXPR, ...]} | {OR: [EXPR, ...]} | {NOT: EXPR}
    T1    := NOW | +5m | YY-MM-DD hh:mm:ss | ISO 8601 | (empty) | null
    T2    := T1 | ^N

Meaning (resolved once, at submission, against the submission instant S):

- ``NOW`` is S. A relative ``T1`` is S + offset; a relative ``T2`` is T1 + offset (S + offset
  when T1 is open). Times without a zone are UTC. ``[T1, T2]`` includes both ends.
- ``^N`` as T2: the interval holds from T1 for as long as the demand has been passed over
  (considered while its window held, but not allocated) at most N scheduling rounds.
- An open T1 has no lower bound, an open T2 no upper bound; ``[]`` always holds.
- AND, OR, NOT are the boolean operators over these intervals.

This module holds what conditions are (their values, ``parse``, the OrderBy helpers);
when they hold, rm_server/domain/demands/evaluation.py.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from rm_server.domain.demands.syntax import (
    DATETIME_RE,
    Arr,
    Empty,
    Node,
    Obj,
    Scalar,
    TimeLangError,
    read,
)

EPSILON = timedelta(microseconds=1)  # the resolution of time: [a, b] is a..b inclusive
MAX_ROUNDS = 1_000_000
MAX_OFFSET = 366 * 24 * 3600  # a relative time or duration of at most a year
MAX_ITEMS = 64  # operands of one AND / OR
# The bounds of a start window (what it costs to evaluate grows with them: module doc of
# the evaluation below). Enough for a working-hours calendar of most of a year.
MAX_INTERVALS = 256  # intervals in one start window, in all
MAX_ROUND_ENDS = 16  # ^N ends in one start window (each one more evaluation for may_hold)
MAX_EXPR_DEPTH = 8  # AND / OR / NOT operators nested in one start window
DEMAND_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RELATIVE_RE = re.compile(r"(?:\d+[smhdSMHD])+")
_RELATIVE_PART_RE = re.compile(r"(\d+)([smhdSMHD])")
_DATETIME_PARTS = re.compile(
    r"(\d{4}|\d{2})-(\d{1,2})-(\d{1,2})"
    r"(?:[ T](\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?)?"
    r"(Z|z|[+-]\d{2}:?\d{2})?"
)


class Strategy(enum.StrEnum):
    STRICT = "strict"  # allocate inside the window, or fail
    LOOSE = "loose"  # may slip past the window by the configured bound


# ----- points, intervals and expressions -----------------------------------------------------


@dataclass(frozen=True)
class Now:
    """The submission instant."""


@dataclass(frozen=True)
class Absolute:
    at: datetime  # timezone-aware

    def __post_init__(self) -> None:
        if self.at.tzinfo is None:
            raise ValueError("absolute times must be timezone-aware")


@dataclass(frozen=True)
class Relative:
    seconds: int  # >= 0


@dataclass(frozen=True)
class Rounds:
    count: int  # passed-over scheduling rounds allowed (T2 only)


Begin = Now | Absolute | Relative
End = Now | Absolute | Relative | Rounds


@dataclass(frozen=True)
class Interval:
    """``[begin, end]`` as written; None is an open end."""

    begin: Begin | None = None
    end: End | None = None


@dataclass(frozen=True)
class Span:
    """A resolved time interval ``[lo, hi]``; None is unbounded."""

    lo: datetime | None
    hi: datetime | None


@dataclass(frozen=True)
class Chances:
    """A resolved ``[lo, ^rounds]``: from lo while passed over at most ``rounds`` rounds."""

    lo: datetime | None
    rounds: int


@dataclass(frozen=True)
class And:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Not:
    item: Expr


Expr = Interval | Span | Chances | And | Or | Not


class WindowBudget:
    """What one start window may hold, counted while it is read (the text here, the
    structured form by the service): each method returns what was exceeded, as the
    ``expected`` part of an error, or None. One budget per window."""

    def __init__(self) -> None:
        self.intervals = 0
        self.round_ends = 0

    def interval(self, end: End | None) -> str | None:
        self.intervals += 1
        if self.intervals > MAX_INTERVALS:
            return f"at most {MAX_INTERVALS} intervals in a start window (its interval limit)"
        if isinstance(end, Rounds):
            self.round_ends += 1
            if self.round_ends > MAX_ROUND_ENDS:
                return f"at most {MAX_ROUND_ENDS} ^N ends in a start window (its ^N limit)"
        return None

    @staticmethod
    def depth(depth: int) -> str | None:
        """``depth``: how many operators enclose the one about to be read."""
        if depth >= MAX_EXPR_DEPTH:
            return (
                f"at most {MAX_EXPR_DEPTH} levels of AND/OR/NOT nesting in a start window"
                " (its nesting limit)"
            )
        return None


@dataclass(frozen=True)
class TimeCondition:
    expr: Expr
    strategy: Strategy = Strategy.STRICT


@dataclass(frozen=True)
class DurationCondition:
    seconds: int
    strategy: Strategy = Strategy.LOOSE  # strict: the ticket is released when it runs over


@dataclass(frozen=True)
class DeadlineCondition:
    point: Begin
    strategy: Strategy = Strategy.LOOSE  # strict: placement must finish by it; released after


@dataclass(frozen=True)
class DemandRef:
    demand_id: str


@dataclass(frozen=True)
class AllOf:
    items: tuple[OrderBy, ...]


@dataclass(frozen=True)
class AnyOf:
    items: tuple[OrderBy, ...]


OrderBy = DemandRef | AllOf | AnyOf


@dataclass(frozen=True)
class Conditions:
    """A demand's time conditions as written (NOW and relative times unresolved)."""

    demand_id: str | None = None
    start: TimeCondition | None = None
    duration: DurationCondition | None = None
    deadline: DeadlineCondition | None = None
    order_by: OrderBy | None = None


# ----- parsing --------------------------------------------------------------------------------

_FIELDS = ("DemandID", "Start", "Duration", "DeadLine", "OrderBy", "Time", "Strategy")
_FIELD_NAMES = ", ".join(_FIELDS)
_POINT = "a time: NOW, +5m, 'YY-MM-DD hh:mm:ss', an ISO 8601 time or nothing (open)"


def _norm(key: str) -> str:
    """Field names, operators and keywords are case-insensitive; '_' and '-' are ignored."""
    return key.replace("_", "").replace("-", "").lower()


class _Interpreter:
    def __init__(self, text: str) -> None:
        self.text = text
        self.budget = WindowBudget()

    def fail(self, node: Node | int, expected: str, found: str | None = None) -> TimeLangError:
        pos = node if isinstance(node, int) else node.pos
        what = found if found is not None else ("" if isinstance(node, int) else node.describe())
        return TimeLangError(self.text, pos, expected, what)

    def fields(self, obj: Obj, allowed: tuple[str, ...]) -> dict[str, tuple[int, Node]]:
        out: dict[str, tuple[int, Node]] = {}
        names = {_norm(a): a for a in allowed}
        for m in obj.members:
            name = names.get(_norm(m.key))
            if name is None:
                expected = "a field name: one of " + ", ".join(allowed)
                raise self.fail(m.key_pos, expected, repr(m.key))
            if name in out:
                raise self.fail(m.key_pos, f"{name} only once", f"a second {m.key!r}")
            out[name] = (m.key_pos, m.value)
        return out

    def conditions(self, root: Obj) -> Conditions:
        f = self.fields(root, _FIELDS)
        start = None
        if "Start" in f:
            for beside in ("Time", "Strategy"):
                if beside in f:
                    raise self.fail(f[beside][0], f"{beside} inside Start, not beside it", "")
            start = self.time_condition(f["Start"][1])
        elif "Time" in f or "Strategy" in f:  # top-level Time/Strategy: shorthand for Start
            start = self.time_fields(f)
        return Conditions(
            demand_id=self.demand_id(f["DemandID"][1]) if "DemandID" in f else None,
            start=start,
            duration=self.duration(f["Duration"][1]) if "Duration" in f else None,
            deadline=self.deadline(f["DeadLine"][1]) if "DeadLine" in f else None,
            order_by=self.order_by(f["OrderBy"][1], 0) if "OrderBy" in f else None,
        )

    # -- Start -------------------------------------------------------------------------------

    def time_condition(self, node: Node) -> TimeCondition:
        if isinstance(node, Obj) and not _is_operator(node):  # {Time: ..., Strategy: ...}
            return self.time_fields(self.fields(node, ("Time", "Strategy")))
        return TimeCondition(self.expr(node, 0))  # Start: [NOW, +5m]  or  Start: {OR: [...]}

    def time_fields(self, f: dict[str, tuple[int, Node]]) -> TimeCondition:
        expr = self.expr(f["Time"][1], 0) if "Time" in f else Interval()
        strategy = self.strategy(f["Strategy"][1]) if "Strategy" in f else Strategy.STRICT
        return TimeCondition(expr, strategy)

    def expr(self, node: Node, depth: int) -> Expr:
        if isinstance(node, Arr):
            if node.items and all(isinstance(i, Arr | Obj) for i in node.items):
                raise self.fail(node, "an interval [T1, T2]; combine intervals with AND or OR")
            interval = self.interval(node)
            exceeded = self.budget.interval(interval.end)
            if exceeded is not None:
                raise self.fail(node, exceeded, f"interval number {self.budget.intervals}")
            return interval
        if isinstance(node, Obj) and _is_operator(node):
            if len(node.members) != 1:
                raise self.fail(node.members[1].key_pos, "one operator (AND, OR or NOT) per {}")
            exceeded = self.budget.depth(depth)
            if exceeded is not None:
                raise self.fail(node, exceeded, f"an operator at level {depth + 1}")
            op = node.members[0]
            name = _norm(op.key)
            if name == "not":
                inner = op.value
                if isinstance(inner, Arr) and len(inner.items) == 1 and _is_expr(inner.items[0]):
                    inner = inner.items[0]  # {NOT: [[NOW, +5m]]}
                return Not(self.expr(inner, depth + 1))
            if not isinstance(op.value, Arr) or not op.value.items:
                raise self.fail(op.value, f"a non-empty array of intervals after {op.key.upper()}")
            if len(op.value.items) > MAX_ITEMS:
                raise self.fail(op.value, f"at most {MAX_ITEMS} items")
            items = tuple(self.expr(i, depth + 1) for i in op.value.items)
            return And(items) if name == "and" else Or(items)
        raise self.fail(node, "an interval [T1, T2] or {AND|OR|NOT: ...}")

    def interval(self, node: Arr) -> Interval:
        if len(node.items) == 1:
            at = _end_of(node.items[0])
            raise self.fail(at, "',' and the end time T2 (leave it empty for an open end)")
        if len(node.items) > 2:
            raise self.fail(node.items[2], "']': an interval has two ends [T1, T2]")
        if not node.items:
            return Interval()
        b, e = node.items
        begin = self.point(b, allow_rounds=False)
        end = self.point(e, allow_rounds=True)
        assert not isinstance(begin, Rounds)
        if isinstance(begin, Absolute) and isinstance(end, Absolute) and end.at < begin.at:
            raise self.fail(e, f"an end at or after the start {_iso(begin.at)}")
        return Interval(begin, end)

    def point(self, node: Node, *, allow_rounds: bool) -> End | None:
        if isinstance(node, Empty):
            return None
        if not isinstance(node, Scalar):
            raise self.fail(node, _POINT + (" or ^N" if allow_rounds else ""))
        text = node.text.strip()
        if _norm(text) == "now":
            return Now()
        if _norm(text) == "null" and node.kind == "bare":
            return None
        if text.startswith("+"):
            return Relative(self.offset(node, text[1:]))
        if text.startswith("^"):
            if not allow_rounds:
                raise self.fail(node, "T1 to be a time; ^N is only allowed as the end T2")
            if not text[1:].isdigit() or int(text[1:]) > MAX_ROUNDS:
                raise self.fail(node, f"^N with N a whole number of rounds (0..{MAX_ROUNDS})")
            return Rounds(int(text[1:]))
        if DATETIME_RE.fullmatch(text):
            return Absolute(self.datetime(node, text))
        raise self.fail(node, _POINT + (" or ^N" if allow_rounds else ""))

    def offset(self, node: Node, text: str) -> int:
        if not _RELATIVE_RE.fullmatch(text):
            raise self.fail(node, "a relative time such as +30s, +5m, +2h, +1d or +1h30m")
        seconds = sum(int(n) * _UNITS[u.lower()] for n, u in _RELATIVE_PART_RE.findall(text))
        if seconds > MAX_OFFSET:
            raise self.fail(node, f"at most {MAX_OFFSET // 86400} days")
        return seconds

    def datetime(self, node: Node, text: str) -> datetime:
        m = _DATETIME_PARTS.fullmatch(text)
        if m is None:  # pragma: no cover - DATETIME_RE and _DATETIME_PARTS agree
            raise self.fail(node, _POINT)
        year, month, day, hour, minute, second, micro, zone = m.groups()
        tz = UTC
        if zone and zone not in ("Z", "z"):
            sign = -1 if zone[0] == "-" else 1
            hh, mm = int(zone[1:3]), int(zone[-2:])
            if hh > 23 or mm > 59:
                raise self.fail(node, "a zone offset between -23:59 and +23:59")
            tz = timezone(sign * timedelta(hours=hh, minutes=mm))
        try:
            at = datetime(
                int(year) + (2000 if len(year) == 2 else 0),  # the paper's YY-MM-DD
                int(month),
                int(day),
                int(hour or 0),
                int(minute or 0),
                int(second or 0),
                int((micro or "0").ljust(6, "0")),
                tzinfo=tz,
            )
        except ValueError as exc:
            raise self.fail(node, f"a valid date and time ({exc})") from None
        return at.astimezone(UTC)

    def strategy(self, node: Node) -> Strategy:
        if isinstance(node, Scalar) and _norm(node.text) in ("strict", "loose"):
            return Strategy(_norm(node.text))
        raise self.fail(node, "strict or loose")

    # -- Duration, DeadLine ------------------------------------------------------------------

    def _with_strategy(self, node: Node) -> tuple[Node, Strategy | None]:
        if isinstance(node, Obj) and not _is_operator(node):
            f = self.fields(node, ("Time", "Strategy"))
            if "Time" not in f:
                raise self.fail(node, "a Time field")
            strategy = self.strategy(f["Strategy"][1]) if "Strategy" in f else None
            return f["Time"][1], strategy
        return node, None

    def duration(self, node: Node) -> DurationCondition:
        value, strategy = self._with_strategy(node)
        seconds: int | None = None
        if isinstance(value, Scalar) and _RELATIVE_RE.fullmatch(value.text.lstrip("+")):
            seconds = self.offset(value, value.text.lstrip("+"))
        elif isinstance(value, Arr) and len(value.items) == 2:
            window = self.interval(value)
            b, e = window.begin, window.end
            if isinstance(b, Absolute) and isinstance(e, Absolute):
                seconds = int((e.at - b.at).total_seconds())
            elif isinstance(b, Now | None) and isinstance(e, Relative):
                seconds = e.seconds
        if seconds is None:
            raise self.fail(value, "a duration: +20m, 1h30m, [NOW, +20m] or [T1, T2] (absolute)")
        return DurationCondition(seconds, strategy or Strategy.LOOSE)

    def deadline(self, node: Node) -> DeadlineCondition:
        value, strategy = self._with_strategy(node)
        at = value
        if isinstance(value, Arr) and len(value.items) == 2:  # {Time: [NOW, +2h]}: the end
            first = self.point(value.items[0], allow_rounds=False)
            if first is not None and not isinstance(first, Now):
                raise self.fail(value.items[0], "NOW or nothing: a deadline is the end T2")
            at = value.items[1]
        point = self.point(at, allow_rounds=False)
        if point is None or isinstance(point, Rounds):
            raise self.fail(at, "a deadline time: +2h, 'YY-MM-DD hh:mm:ss' or ISO 8601")
        return DeadlineCondition(point, strategy or Strategy.LOOSE)

    # -- DemandID, OrderBy -------------------------------------------------------------------

    def demand_id(self, node: Node) -> str:
        if isinstance(node, Scalar) and node.kind != "sigil":
            text = node.text
            if DEMAND_ID_RE.fullmatch(text):
                return text
        raise self.fail(node, "a demand id: letters, digits and _ . : @ - (at most 128)")

    def order_by(self, node: Node, depth: int) -> OrderBy:
        if depth > 16:
            raise self.fail(node, "at most 16 levels of OrderBy nesting")
        if isinstance(node, Scalar):
            return DemandRef(self.demand_id(node))
        if isinstance(node, Arr):  # a list: after all of them
            if not node.items or len(node.items) > MAX_ITEMS:
                raise self.fail(node, f"1 to {MAX_ITEMS} demand ids")
            return AllOf(tuple(self.order_by(i, depth + 1) for i in node.items))
        if isinstance(node, Obj) and len(node.members) == 1:
            op = node.members[0]
            name = _norm(op.key)
            if name == "not":
                expected = "AND or OR: OrderBy waits for demands to finish"
                raise self.fail(op.key_pos, expected, repr(op.key))
            if name in ("and", "or"):
                if not isinstance(op.value, Arr) or not op.value.items:
                    raise self.fail(op.value, f"a non-empty array of demand ids after {op.key}")
                items = tuple(self.order_by(i, depth + 1) for i in op.value.items)
                return AllOf(items) if name == "and" else AnyOf(items)
        raise self.fail(node, "a demand id, [id, ...], {AND: [...]} or {OR: [...]}")


def _is_operator(obj: Obj) -> bool:
    return any(_norm(m.key) in ("and", "or", "not") for m in obj.members)


def _is_expr(node: Node) -> bool:
    return isinstance(node, Arr) or (isinstance(node, Obj) and _is_operator(node))


def _end_of(node: Node) -> int:
    if isinstance(node, Scalar):
        return node.pos + len(node.text) + (2 if node.kind == "string" else 0)
    return node.pos + 1


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse(text: str) -> Conditions:
    """Parse the paper's JSON (or strict JSON) into Conditions; TimeLangError if malformed."""
    return _Interpreter(text).conditions(read(text))


# ----- OrderBy --------------------------------------------------------------------------------


def order_ids(order: OrderBy | None) -> tuple[str, ...]:
    """Every demand id named, in first-mention order."""
    out: dict[str, None] = {}

    def walk(o: OrderBy) -> None:
        if isinstance(o, DemandRef):
            out[o.demand_id] = None
        else:
            for i in o.items:
                walk(i)

    if order is not None:
        walk(order)
    return tuple(out)


def order_value(order: OrderBy, finished: dict[str, bool | None]) -> bool | None:
    """Three-valued: True when satisfied, False when it never can be, None while pending.

    ``finished`` maps a demand id to True (FINISHED), False (FAILED) or None (anything else,
    including not yet submitted).
    """
    if isinstance(order, DemandRef):
        return finished.get(order.demand_id)
    values = [order_value(i, finished) for i in order.items]
    if isinstance(order, AllOf):
        if any(v is False for v in values):
            return False
        return True if all(v is True for v in values) else None
    if any(v is True for v in values):
        return True
    return False if all(v is False for v in values) else None
