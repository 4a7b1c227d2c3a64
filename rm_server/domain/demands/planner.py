"""The demand planner, pure: admission against a capacity plan, and the per-round decision.

**The plan.** Every active demand occupies ``[start - lead, start + hold)`` on each of its
resource-carrying labels, where ``start`` is the instant it is planned to be allocated and
``hold`` its Duration (else the time to its DeadLine, else a default). Like YARN's
reservation system, a new demand is *placed*: :func:`place` picks the earliest start in its
window (extended by the slip bound when loose, and not before the planned ends of the
demands it is ordered after) at which, at every instant of its occupation, the sum of the
overlapping demands plus its own resource stays within each label's maximum minus its
protected part. No such start: the demand is refused, with the shortfalls.

**The rounds.** :func:`decide` looks at one demand at one instant and returns what to do
next; the store carries it out in the same transaction and asks again. A demand is
reserved (ALLOCATING) a lead time before its planned start once its OrderBy is satisfied,
tries to allocate in every round in which its window holds, counts the rounds in which it
was passed over (``^N``), fails when a strict window closes, slips at most the slip bound
past a loose one, fails unclaimed allocations, and watches Duration and DeadLine.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from labelrm_common.quantity import Shortfall
from rm_server.domain.admission import label_shortfalls
from rm_server.domain.demands.evaluation import (
    breakpoints,
    estimate_rounds,
    holds,
    ignore_rounds,
    last_instant,
    may_hold,
    segments,
)
from rm_server.domain.demands.state import DemandState
from rm_server.domain.demands.timelang import (
    EPSILON,
    Expr,
    OrderBy,
    Strategy,
    order_ids,
    order_value,
)
from rm_server.domain.demands.waits import ORDER_BY_MISSING
from rm_server.domain.errors import DomainError
from rm_server.domain.resources import Resource, ResourceError


@dataclass(frozen=True)
class PlannerSettings:
    round_length: timedelta = timedelta(seconds=1)  # one scheduling round (and ^N estimate)
    lead_time: timedelta = timedelta(seconds=60)  # reserve this long before the start
    claim_timeout: timedelta = timedelta(minutes=5)  # ALLOCATED -> released and FAILED
    loose_slip: timedelta = timedelta(minutes=15)  # how far a loose demand may slip
    default_duration: timedelta = timedelta(hours=1)  # plan hold without Duration/DeadLine
    # How long a demand without an end to its window waits for a demand its OrderBy names
    # to be submitted (ORDER_BY_MISSING past it; with an end, the window bounds the wait).
    order_by_timeout: timedelta = timedelta(hours=1)
    # An allocation becomes visible when its transaction commits, a little after it is
    # decided: it is recorded at the decision plus this margin, the latest instant the
    # commit may land (the round gives it up if it is not committing by then), and made
    # only if its window still holds then. Less than half a round.
    commit_margin: timedelta = timedelta(milliseconds=250)


@dataclass(frozen=True)
class PlanEntry:
    """The occupation of its labels by one or more accepted demands that share labels and
    times (``resource``: their sum); ``end`` None is unbounded. A label's plan is read as
    such groups (rm_server/store/demands.py): demands planned in the same round share
    their times, so what admission sums grows with the distinct occupations, not with
    the demands."""

    labels: tuple[str, ...]
    resource: Resource
    start: datetime
    end: datetime | None


@dataclass(frozen=True)
class LabelCapacity:
    label: str
    maximum: Resource
    protected: Resource


@dataclass(frozen=True)
class Hold:
    """How long an allocation is expected to last."""

    duration: timedelta | None = None
    deadline: datetime | None = None
    deadline_strict: bool = False

    def end(self, start: datetime, settings: PlannerSettings) -> datetime:
        if self.duration is not None:
            return start + self.duration
        if self.deadline is not None and self.deadline > start:
            return self.deadline
        return start + settings.default_duration

    def latest_start(self) -> datetime | None:
        """A strict deadline bounds the start: the work must fit before it."""
        if not self.deadline_strict or self.deadline is None:
            return None
        return self.deadline - (self.duration or timedelta(0))


@dataclass(frozen=True)
class Candidate:
    """A demand being admitted."""

    demand_id: str
    labels: tuple[str, ...]
    resource: Resource
    window: Expr  # resolved
    strategy: Strategy
    submitted: datetime
    hold: Hold = field(default_factory=Hold)
    not_before: datetime | None = None  # the planned end of what it is ordered after
    user: str = ""  # whose demand (ids are per user)


@dataclass(frozen=True)
class Placement:
    start: datetime  # planned allocation instant
    plan_start: datetime
    plan_end: datetime
    slipped: timedelta  # past the end of a loose window (zero when inside it)


@dataclass(frozen=True)
class PlanRefusal:
    reason: str
    shortfalls: tuple[Shortfall, ...] = ()


class PlanError(DomainError):
    """Resources that cannot be compared with a label's maximum (mismatched kinds): the
    demand's ``resource`` does not match the label (the field it names)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "resource")


def window_segments(
    c: Candidate, settings: PlannerSettings
) -> list[tuple[datetime, datetime | None]]:
    """The instants at which ``c`` may be planned to start, loose slip included.

    Each segment ends one round and the commit margin before the instant by which the
    demand must be allocated (the window's end, plus the slip bound when loose, or the
    latest start a strict deadline allows): the planner looks at a demand once per round,
    and an allocation is visible up to the commit margin after it is decided, so a start
    planned closer to that end could be looked at or seen only after it.
    """
    since = max(c.submitted, c.not_before or c.submitted)
    timed = estimate_rounds(c.window, c.submitted, settings.round_length)
    segs = segments(timed, since)
    if c.strategy is Strategy.LOOSE:
        stretched: list[tuple[datetime, datetime | None]] = []
        for a, b in segs:
            end = None if b is None else b + settings.loose_slip
            if stretched and (stretched[-1][1] is None or stretched[-1][1] >= a):
                prev_end = stretched[-1][1]
                merged = None if prev_end is None or end is None else max(prev_end, end)
                stretched[-1] = (stretched[-1][0], merged)
            else:
                stretched.append((a, end))
        segs = stretched
    latest = c.hold.latest_start()
    if latest is not None:
        segs = [(a, b if b is not None and b < latest else latest) for a, b in segs if a <= latest]
    # A round may look at it up to a round late, and an allocation it then makes is
    # visible up to the commit margin later still (decide).
    margin = settings.round_length + settings.commit_margin
    return [(a, None if b is None else b - margin) for a, b in segs if b is None or b - margin >= a]


def in_use_at(
    entries: Sequence[PlanEntry], probes: Sequence[datetime], like: Resource
) -> Iterator[tuple[datetime, Resource]]:
    """The sum of ``entries`` in the plan at each instant of ``probes`` (ascending), an
    entry counting from its start until before its end; zero is shaped like ``like``.

    One sweep over the entries sorted by start and by end: O(n log n) for any number of
    probes (summing the entries again at each probe was O(probes x n), and a label with
    many demands, each planned from a moment of its own, has as many probes).
    """
    live = [e for e in entries if e.end is None or e.start < e.end]  # others never count
    starts = sorted(((e.start, e.resource) for e in live), key=lambda x: x[0])
    ends = sorted(((e.end, e.resource) for e in live if e.end is not None), key=lambda x: x[0])
    acc = Resource.zero(like.kind, like.queue)
    i = j = 0
    for at in probes:
        while i < len(starts) and starts[i][0] <= at:
            acc = acc + starts[i][1]
            i += 1
        while j < len(ends) and ends[j][0] <= at:
            acc = acc - ends[j][1]  # it started before it ended: added above
            j += 1
        yield at, acc


def shortfalls_at(
    c: Candidate,
    start: datetime,
    end: datetime,
    entries: Sequence[PlanEntry],
    capacities: Mapping[str, LabelCapacity],
) -> list[Shortfall]:
    """Every label and dimension short at some instant of the occupation [start, end)."""
    out: list[Shortfall] = []
    for label in c.labels:
        cap = capacities.get(label)
        if cap is None:  # no maximum: not planned
            continue
        on_label = [e for e in entries if label in e.labels]
        probes = sorted({start} | {e.start for e in on_label if start < e.start < end})
        try:
            for _, used in in_use_at(on_label, probes, c.resource):
                found = label_shortfalls(
                    label, cap.maximum, used, Resource.zero(used.kind), cap.protected, c.resource
                )
                if found:
                    out.extend(found)
                    break
        except ResourceError as exc:
            raise PlanError(f"resource does not match label {label}: {exc}") from exc
    return out


def place(
    c: Candidate,
    entries: Sequence[PlanEntry],
    capacities: Mapping[str, LabelCapacity],
    settings: PlannerSettings,
) -> Placement | PlanRefusal:
    """The earliest start at which the plan has room for ``c``, or why there is none
    (``entries``: the plan without ``c``)."""
    segs = window_segments(c, settings)
    if not segs:
        return PlanRefusal(
            "its start window has already closed, never opens, or leaves less than one"
            f" scheduling round ({settings.round_length}) and the commit margin"
            f" ({settings.commit_margin}) to allocate it"
        )
    ends = sorted({e.end + settings.lead_time for e in entries if e.end is not None})
    first_shortfalls: list[Shortfall] | None = None
    for a, b in segs:
        for start in [a] + [t for t in ends if a < t and (b is None or t <= b)]:
            occupation = (start - settings.lead_time, c.hold.end(start, settings))
            found = shortfalls_at(c, *occupation, entries, capacities)
            if not found:
                window_end = last_instant(ignore_rounds(c.window), c.submitted)
                slipped = start - window_end if window_end and start > window_end else timedelta()
                return Placement(start, occupation[0], occupation[1], slipped)
            if first_shortfalls is None:
                first_shortfalls = found
    labels = ", ".join(sorted({s.label for s in first_shortfalls or ()}))
    how = "its window" if c.strategy is Strategy.STRICT else "its window plus the loose slip"
    return PlanRefusal(
        f"the plan has no room for it within {how} on {labels}: accepted demands overlap",
        tuple(first_shortfalls or ()),
    )


# ----- one round ------------------------------------------------------------------------------


class Action(enum.StrEnum):
    WAIT = "WAIT"
    RESERVE = "RESERVE"  # ACCEPTED -> ALLOCATING: reserve capacity on the labels
    ALLOCATE = "ALLOCATE"  # try the Apply; refused: passed over one round
    CLOSE = "CLOSE"  # a loose window closed: record when, keep trying within the slip
    FAIL = "FAIL"
    EXPIRE_CLAIM = "EXPIRE_CLAIM"  # release the ticket, then FAIL
    FINISH = "FINISH"
    OVERRUN = "OVERRUN"  # record a Duration/DeadLine overrun; release it too if enforced
    REPLAN = "REPLAN"  # OrderBy satisfied before its planned start: try to place it earlier
    PARK = "PARK"  # wait for its OrderBy: no round until a predecessor ends, or next_check


@dataclass(frozen=True)
class DemandView:
    """What the planner needs to know of one demand."""

    state: DemandState
    window: Expr  # resolved
    strategy: Strategy
    submitted: datetime
    planned_start: datetime
    hold: Hold = field(default_factory=Hold)
    duration_strict: bool = False
    order: OrderBy | None = None
    rounds: int = 0
    closed_at: datetime | None = None
    allocated_at: datetime | None = None
    claim_expires_at: datetime | None = None
    overruns: frozenset[str] = frozenset()  # "duration", "deadline" already recorded


@dataclass(frozen=True)
class TicketStatus:
    live: bool
    final_state: str = ""  # RELEASED or EXPIRED once ended
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""
    next_check: datetime | None = None  # when to look again (None: terminal)
    closed_at: datetime | None = None  # CLOSE
    overrun: str = ""  # OVERRUN: "duration" or "deadline"
    enforce: bool = False  # OVERRUN: release the ticket and fail


def _fmt(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def order_bound(d: DemandView, settings: PlannerSettings) -> datetime:
    """The instant by which the demands its OrderBy names must have been submitted: the
    end of its window (plus the slip bound when loose), or, when its window has no end,
    ``order_by_timeout`` after its submission. Past it, a demand whose OrderBy can only
    hold once a demand not submitted yet exists FAILS (ORDER_BY_MISSING)."""
    end = last_instant(ignore_rounds(d.window), d.submitted)
    if end is None:
        return d.submitted + settings.order_by_timeout
    return end + settings.loose_slip if d.strategy is Strategy.LOOSE else end


def decide(
    d: DemandView,
    now: datetime,
    settings: PlannerSettings,
    finished: Mapping[str, bool | None] | None = None,
    ticket: TicketStatus | None = None,
    *,
    round_start: datetime | None = None,
    missing: Collection[str] = (),
) -> Decision:
    """The next step for one demand at ``now``.

    ``finished`` maps each OrderBy id to True (FINISHED), False (FAILED) or None;
    ``missing``: the OrderBy ids of which no demand was submitted (by this user); ``ticket``
    is the state of the demand's ticket (ALLOCATED and MONITORING demands).
    ``round_start``: the start of the planner pass this round belongs to (default ``now``).
    The next round is dated one ``round_length`` after it, not after ``now``: passes start
    one interval apart, and a round decided a little into its pass, dated from its own
    time, would not yet be due when the next pass starts, and get a round every *two*.
    """
    S = DemandState
    soon = (round_start or now) + settings.round_length
    if d.state in (S.ACCEPTED, S.ALLOCATING):
        return _before_allocation(d, now, soon, settings, dict(finished or {}), missing)
    if d.state is S.ALLOCATED:
        assert ticket is not None and d.claim_expires_at is not None
        if not ticket.live:
            return Decision(
                Action.FAIL,
                f"its ticket ended before the demand was claimed ({ticket.final_state}:"
                f" {ticket.reason})",
            )
        if now >= d.claim_expires_at:
            return Decision(
                Action.EXPIRE_CLAIM,
                f"not claimed within the claim timeout ({settings.claim_timeout}); ticket released",
            )
        return Decision(Action.WAIT, next_check=min(d.claim_expires_at, soon))
    if d.state is S.MONITORING:
        assert ticket is not None and d.allocated_at is not None
        if not ticket.live:
            if ticket.final_state == "RELEASED":
                return Decision(Action.FINISH, f"ticket released ({ticket.reason})")
            return Decision(Action.FAIL, f"ticket {ticket.final_state}: {ticket.reason}")
        duration, deadline = d.hold.duration, d.hold.deadline
        if duration is not None and "duration" not in d.overruns:
            overrun_at = d.allocated_at + duration
            if now > overrun_at:
                return Decision(
                    Action.OVERRUN,
                    f"running past its Duration of {duration}",
                    overrun="duration",
                    enforce=d.duration_strict,
                )
        if deadline is not None and "deadline" not in d.overruns and now > deadline:
            return Decision(
                Action.OVERRUN,
                f"running past its DeadLine {_fmt(deadline)}",
                overrun="deadline",
                enforce=d.hold.deadline_strict,
            )
        return Decision(Action.WAIT, next_check=soon)
    raise ValueError(f"the planner has nothing to decide for a {d.state} demand")


def _before_allocation(
    d: DemandView,
    now: datetime,
    soon: datetime,
    settings: PlannerSettings,
    finished: dict[str, bool | None],
    missing: Collection[str] = (),
) -> Decision:
    S = DemandState
    satisfied: bool | None = True
    if d.order is not None:
        satisfied = order_value(d.order, finished)
        if satisfied is False:
            failed = [i for i in order_ids(d.order) if finished.get(i) is False]
            return Decision(
                Action.FAIL, "OrderBy can no longer be satisfied: " + ", ".join(failed) + " FAILED"
            )
        absent = [i for i in order_ids(d.order) if i in missing]
        # Only if it cannot hold without them: {OR: [a, b]} with b submitted waits for b.
        needs_absent = order_value(d.order, {**finished, **dict.fromkeys(absent, False)}) is False
        bound = order_bound(d, settings)
        if satisfied is None and absent and needs_absent and now > bound:
            return Decision(
                Action.FAIL,
                f"{ORDER_BY_MISSING}: OrderBy names {', '.join(absent)}, not submitted"
                f" by {_fmt(bound)}",
            )
    # Open now and still when the allocation, recorded at now + commit_margin, is visible.
    open_now = holds(d.window, now, d.rounds)
    visible = d.strategy is Strategy.LOOSE or holds(  # a loose one may slip past anyway
        d.window, now + settings.commit_margin, d.rounds
    )
    closed = not may_hold(d.window, now, d.rounds)
    slipping = False
    if closed:
        if d.strategy is Strategy.STRICT:
            return Decision(
                Action.FAIL,
                f"strict start window closed before it could be allocated"
                f" (passed over {d.rounds} rounds)",
            )
        if d.closed_at is None:
            end = last_instant(ignore_rounds(d.window), d.submitted)
            at = now if end is None or end > now else end
            return Decision(Action.CLOSE, f"loose start window closed at {_fmt(at)}", closed_at=at)
        if now > d.closed_at + settings.loose_slip:
            return Decision(
                Action.FAIL,
                f"loose start window closed at {_fmt(d.closed_at)} and the slip bound"
                f" ({settings.loose_slip}) passed without capacity",
            )
        slipping = True
    if d.state is S.ACCEPTED:
        if satisfied is None:  # waiting for the demands it is ordered after: parked
            return Decision(
                Action.PARK, next_check=park_until(d, now, soon - settings.round_length, settings)
            )
        reserve_at = d.planned_start - settings.lead_time
        if now >= reserve_at:
            return Decision(Action.RESERVE, "lead time before its planned start")
        if d.order is not None:  # placed after its predecessors' *planned* ends; they are done
            return Decision(Action.REPLAN, "OrderBy satisfied", next_check=min(soon, reserve_at))
        return Decision(Action.WAIT, next_check=reserve_at)
    if ((open_now and visible) or slipping) and now >= d.planned_start:
        return Decision(Action.ALLOCATE, "slipping (loose)" if slipping else "window open")
    if now < d.planned_start:  # its first try is at its planned start, not a round after
        return Decision(Action.WAIT, next_check=min(soon, d.planned_start))
    return Decision(Action.WAIT, next_check=soon)


def occupation(
    d: DemandView, now: datetime, settings: PlannerSettings
) -> tuple[datetime, datetime | None]:
    """The demand's current entry in the plan: where it is planned, or where it runs.

    A demand that slipped past its planned start is planned from now; one that holds its
    allocation past the planned end keeps occupying the plan until it ends.
    """
    if d.allocated_at is not None:
        end = d.hold.end(d.allocated_at, settings)
        return d.allocated_at, max(end, now + settings.round_length)
    start = max(d.planned_start, now)
    return start - settings.lead_time, d.hold.end(start, settings)


# ----- parked demands -------------------------------------------------------------------------

# The longest a parked demand goes without a round: a backstop, should what would wake it
# (a change on its labels, a predecessor's end) be missed, e.g. by a replica that died.
PARK_HORIZON = timedelta(minutes=15)


def passes_since(parked_at: datetime, at: datetime, round_length: timedelta) -> int:
    """The planner passes (one per ``round_length``) due after the one that parked a
    demand at ``parked_at``, by ``at``: the rounds it has been passed over since."""
    return max(0, int((at - parked_at) / round_length))


def park_until(
    d: DemandView, now: datetime, round_start: datetime, settings: PlannerSettings
) -> datetime:
    """The first instant after ``now`` at which a parked demand's decision may change
    while nothing it waits for does (its labels' room, its predecessors): an end of its
    window (then just after), the pass in which ``^N`` runs out (``d.rounds``: counted
    up to this round's), the end of a loose slip, its OrderBy bound (planner.order_bound),
    or the horizon. It gets a round then; a change it waits for wakes it earlier."""
    times, counts = breakpoints(d.window)
    length = settings.round_length
    candidates = [round_start + PARK_HORIZON]
    candidates += [t for at in times for t in (at, at + EPSILON)]
    # In the pass (counted from this one) where rounds passed over exceed the count.
    candidates += [round_start + length * (c - d.rounds + 2) for c in counts if c + 1 >= d.rounds]
    if d.closed_at is not None:
        candidates.append(d.closed_at + settings.loose_slip + EPSILON)
    if d.order is not None:
        candidates.append(order_bound(d, settings) + EPSILON)
    return min(t for t in candidates if t > now)
