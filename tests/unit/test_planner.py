"""The pure planner: placement against the plan, and the decision of each round."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import cast

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from rm_server.domain.demands.evaluation import (
    holds,
)
from rm_server.domain.demands.planner import (
    PARK_HORIZON,
    Action,
    Candidate,
    DemandView,
    Hold,
    LabelCapacity,
    Placement,
    PlanEntry,
    PlannerSettings,
    PlanRefusal,
    TicketStatus,
    decide,
    in_use_at,
    occupation,
    park_until,
    passes_since,
    place,
)
from rm_server.domain.demands.state import DemandState
from rm_server.domain.demands.timelang import (
    EPSILON,
    AllOf,
    AnyOf,
    Chances,
    DemandRef,
    Span,
    Strategy,
)
from rm_server.domain.resources import Resource
from tests.support.messages import present

T = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SET = PlannerSettings(
    round_length=timedelta(seconds=10),
    lead_time=timedelta(minutes=1),
    claim_timeout=timedelta(minutes=5),
    loose_slip=timedelta(minutes=15),
    default_duration=timedelta(hours=1),
)
L = "userCreator=alice-IDE,engineType=spark-3.2.1"
CAP = {L: LabelCapacity(L, Resource.load(4, 4000), Resource.load(0, 0))}
S = DemandState


def m(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


def cand(
    demand_id: str,
    mem: int,
    window,
    *,
    strategy=Strategy.STRICT,
    minutes: float = 30,
    submitted: datetime = T,
    **kw,
) -> Candidate:
    return Candidate(
        demand_id,
        (L,),
        Resource.load(mem, 100),
        window,
        strategy,
        submitted,
        Hold(duration=timedelta(minutes=minutes)),
        **kw,
    )


def entry(c: Candidate, p: Placement) -> PlanEntry:
    return PlanEntry(c.labels, c.resource, p.plan_start, p.plan_end)


# ----- placement --------------------------------------------------------------------------------


def test_placed_at_the_window_start_with_the_lead_time():
    p = place(cand("a", 3, Span(m(10), m(20))), [], CAP, SET)
    assert p == Placement(m(10), m(9), m(40), timedelta())


def test_overlap_beyond_capacity_is_refused_with_the_shortfall():
    a = cand("a", 3, Span(m(0), m(10)))
    pa = place(a, [], CAP, SET)
    assert isinstance(pa, Placement)
    b = cand("b", 3, Span(m(5), m(15)))
    refusal = place(b, [entry(a, pa)], CAP, SET)
    assert isinstance(refusal, PlanRefusal)
    assert "no room" in refusal.reason and L in refusal.reason
    (s,) = refusal.shortfalls
    assert (s.label, s.dimension, s.requested, s.available) == (L, "memory_bytes", 3, 1)
    # One that fits beside it is accepted.
    assert isinstance(place(cand("c", 1, Span(m(5), m(15))), [entry(a, pa)], CAP, SET), Placement)


def test_a_loose_demand_slips_behind_the_overlap_within_the_bound():
    a = cand("a", 3, Span(m(0), m(10)), minutes=20)
    pa = place(a, [], CAP, SET)
    assert isinstance(pa, Placement) and pa.plan_end == m(20)
    b = cand("b", 3, Span(m(5), m(10)), strategy=Strategy.LOOSE)
    pb = place(b, [entry(a, pa)], CAP, SET)
    assert isinstance(pb, Placement)
    assert pb.start == m(21)  # a's end plus the lead time
    assert pb.slipped == timedelta(minutes=11)
    far = cand("c", 3, Span(m(5), m(10)), strategy=Strategy.LOOSE, minutes=60)
    blocker = PlanEntry((L,), Resource.load(3, 1), m(0), m(40))
    assert isinstance(place(far, [blocker], CAP, SET), PlanRefusal)  # 10 + 15 < 41


def test_a_demand_bigger_than_the_label_is_refused_and_unlimited_labels_are_not_planned():
    assert isinstance(place(cand("a", 5, Span(m(0), None)), [], CAP, SET), PlanRefusal)
    assert isinstance(place(cand("a", 5, Span(m(0), None)), [], {}, SET), Placement)


def test_window_in_the_past_and_strict_deadline():
    assert "closed" in place(cand("a", 1, Span(m(-20), m(-10))), [], CAP, SET).reason  # type: ignore[union-attr]
    c = replace(
        cand("a", 3, Span(m(0), m(60))),
        hold=Hold(timedelta(minutes=30), deadline=m(45), deadline_strict=True),
    )
    blocker = PlanEntry((L,), Resource.load(3, 1), m(0), m(20))
    assert isinstance(place(c, [blocker], CAP, SET), PlanRefusal)  # 20+1+30 > 45
    loose_deadline = replace(c, hold=Hold(timedelta(minutes=30), deadline=m(45)))
    assert isinstance(place(loose_deadline, [blocker], CAP, SET), Placement)


def test_order_by_starts_after_the_planned_end_of_its_predecessor():
    p = place(cand("b", 1, Span(m(0), None), not_before=m(30)), [], CAP, SET)
    assert isinstance(p, Placement) and p.start == m(30)


def test_rounds_windows_are_planned_for_n_plus_one_rounds():
    p = place(cand("a", 4, Chances(m(0), 2)), [], CAP, SET)
    assert isinstance(p, Placement) and p.start == m(0)
    blocker = PlanEntry((L,), Resource.load(1, 1), m(0), m(0.4))
    assert isinstance(place(cand("a", 4, Chances(m(0), 2)), [blocker], CAP, SET), PlanRefusal)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 120),  # window start (minutes)
            st.integers(0, 60),  # window length
            st.integers(1, 90),  # duration
            st.integers(1, 4),  # memory
            st.booleans(),  # loose
        ),
        min_size=1,
        max_size=25,
    )
)
def test_accepted_placements_never_overcommit(specs):
    entries: list[PlanEntry] = []
    for i, (start, length, minutes, mem, loose) in enumerate(specs):
        c = cand(
            f"d{i}",
            mem,
            Span(m(start), m(start + length)),
            strategy=Strategy.LOOSE if loose else Strategy.STRICT,
            minutes=minutes,
        )
        p = place(c, entries, CAP, SET)
        if isinstance(p, Placement):
            window = cast(Span, c.window)  # the Span built above
            assert present(window.lo) <= p.start
            assert p.start <= m(start + length) + (SET.loose_slip if loose else timedelta())
            entries.append(entry(c, p))
    for probe in {e.start for e in entries}:
        used = sum(
            e.resource.get("memory_bytes")
            for e in entries
            if e.start <= probe and (e.end is None or probe < e.end)
        )
        assert used <= 4


# ----- decisions --------------------------------------------------------------------------------


def view(window, state=S.ACCEPTED, planned=None, **kw) -> DemandView:
    start = planned if planned is not None else (window.lo or T)
    return DemandView(state, window, kw.pop("strategy", Strategy.STRICT), T, start, **kw)


def test_window_honoured_reserve_at_lead_then_allocate_inside():
    d = view(Span(m(10), m(20)))
    wait = decide(d, m(5), SET)
    assert wait.action is Action.WAIT and wait.next_check == m(9)
    assert decide(d, m(9), SET).action is Action.RESERVE
    allocating = replace(d, state=S.ALLOCATING)
    assert decide(allocating, m(9.5), SET).action is Action.WAIT  # lead time: not yet
    assert decide(allocating, m(10), SET).action is Action.ALLOCATE
    last = m(20) - SET.commit_margin  # recorded at + the margin: still inside
    assert decide(allocating, last, SET).action is Action.ALLOCATE
    # Closer to the end, the allocation could become visible after it: not made.
    assert decide(allocating, m(20), SET).action is Action.WAIT


def test_strict_fails_when_the_window_closes():
    d = view(Span(m(10), m(20)), state=S.ALLOCATING, rounds=7)
    fail = decide(d, m(20) + timedelta(microseconds=1), SET)
    assert fail.action is Action.FAIL and "strict start window closed" in fail.reason
    assert "7 rounds" in fail.reason


def test_loose_slips_within_the_bound_then_fails():
    d = view(Span(m(10), m(20)), state=S.ALLOCATING, strategy=Strategy.LOOSE)
    close = decide(d, m(25), SET)
    assert close.action is Action.CLOSE and close.closed_at == m(20)
    d = replace(d, closed_at=close.closed_at)
    assert decide(d, m(25), SET).action is Action.ALLOCATE
    assert decide(d, m(35), SET).action is Action.ALLOCATE
    fail = decide(d, m(35) + timedelta(seconds=1), SET)
    assert fail.action is Action.FAIL and "slip bound" in fail.reason


def test_rounds_are_counted_chances():
    d = view(Chances(m(0), 3), state=S.ALLOCATING)
    assert decide(replace(d, rounds=3), m(50), SET).action is Action.ALLOCATE
    assert decide(replace(d, rounds=4), m(50), SET).action is Action.FAIL


def test_order_by_waits_then_goes_or_fails():
    order = AllOf((DemandRef("a"), AnyOf((DemandRef("b"), DemandRef("c")))))
    d = view(Span(m(0), None), order=order)
    assert decide(d, m(1), SET, {}).action is Action.PARK  # until a predecessor ends
    assert decide(d, m(1), SET, {"a": True, "b": None}).action is Action.PARK
    assert decide(d, m(1), SET, {"a": True, "c": True}).action is Action.RESERVE
    fail = decide(d, m(1), SET, {"a": False})
    assert fail.action is Action.FAIL and "a FAILED" in fail.reason


def test_claim_timeout_and_monitoring():
    d = view(
        Span(m(0), None),
        state=S.ALLOCATED,
        allocated_at=m(0),
        claim_expires_at=m(5),
        hold=Hold(timedelta(minutes=20), deadline=m(30)),
    )
    live = TicketStatus(True)
    assert decide(d, m(1), SET, ticket=live).next_check == m(1) + SET.round_length
    assert decide(d, m(5), SET, ticket=live).action is Action.EXPIRE_CLAIM
    gone = TicketStatus(False, "RELEASED", "released")
    assert decide(d, m(1), SET, ticket=gone).action is Action.FAIL
    mon = replace(d, state=S.MONITORING)
    assert decide(mon, m(10), SET, ticket=live).action is Action.WAIT
    assert decide(mon, m(10), SET, ticket=gone).action is Action.FINISH
    expired = TicketStatus(False, "EXPIRED", "lock timeout")
    assert decide(mon, m(10), SET, ticket=expired).action is Action.FAIL
    over = decide(mon, m(21), SET, ticket=live)
    assert (over.action, over.overrun, over.enforce) == (Action.OVERRUN, "duration", False)
    noted = replace(mon, overruns=frozenset({"duration"}), duration_strict=True)
    late = decide(noted, m(31), SET, ticket=live)
    assert (late.action, late.overrun) == (Action.OVERRUN, "deadline")
    strict = replace(mon, duration_strict=True)
    assert decide(strict, m(21), SET, ticket=live).enforce


def test_occupation_follows_slips_and_overruns():
    d = view(Span(m(0), None), hold=Hold(timedelta(minutes=20)))
    assert occupation(d, m(-5), SET) == (m(-1), m(20))
    assert occupation(d, m(5), SET) == (m(4), m(25))  # slipped: planned from now
    running = replace(d, state=S.MONITORING, allocated_at=m(5))
    assert occupation(running, m(10), SET) == (m(5), m(25))
    assert occupation(running, m(40), SET) == (m(5), m(40) + SET.round_length)


@given(
    st.integers(0, 30),
    st.integers(0, 30),
    st.integers(-10, 80),
    st.integers(0, 5),
    st.booleans(),
)
def test_never_allocates_outside_the_window_or_the_slip(start, length, probe, rounds, loose):
    window = Span(m(start), m(start + length))
    strategy = Strategy.LOOSE if loose else Strategy.STRICT
    d = view(window, state=S.ALLOCATING, strategy=strategy, rounds=rounds)
    now = m(probe)
    first = decide(d, now, SET)
    if first.action is Action.CLOSE:
        d = replace(d, closed_at=first.closed_at)
    decision = decide(d, now, SET)
    if decision.action is Action.ALLOCATE:
        assert now >= d.planned_start
        if loose:
            assert now <= m(start + length) + SET.loose_slip
        else:  # decided in the window, and visible (recorded) in it too
            assert holds(window, now, rounds)
            assert holds(window, now + SET.commit_margin, rounds)


# ----- an admitted demand is allocated, never planned too close to its window's end --------


def _run_rounds(c: Candidate, p: Placement, latencies: list[int]) -> tuple[Action, datetime]:
    """Drive :func:`decide` from the submission as the background planner would: each round
    looks at the demand when it is due, late by up to (not including) one round. The
    labels have room whenever it tries. Returns the last action and its instant."""
    d = DemandView(S.ACCEPTED, c.window, c.strategy, c.submitted, p.start, hold=c.hold, rounds=0)
    now = c.submitted
    lateness = iter(latencies)
    for _ in range(10_000):
        decision = decide(d, now, SET)
        match decision.action:
            case Action.RESERVE:
                d = replace(d, state=S.ALLOCATING)
            case Action.CLOSE:
                d = replace(d, closed_at=decision.closed_at)
            case Action.WAIT:
                assert decision.next_check is not None and decision.next_check > now
                now = decision.next_check + timedelta(microseconds=next(lateness, 0))
            case _:
                return decision.action, now
    raise AssertionError("no decision within 10 000 rounds")


ROUND_US = int(SET.round_length.total_seconds() * 1_000_000)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 3600),  # window start (seconds after submission)
    st.integers(0, 600),  # window length (seconds)
    st.integers(0, 3600 * 1000),  # the blocker's end (milliseconds after submission)
    st.booleans(),  # loose
    st.lists(st.integers(0, ROUND_US - 1), max_size=50),  # lateness (microseconds)
)
@example(60, 300, 301_995, False, [9_000_000] * 50)  # a start planned 5 ms before T2
@example(0, 0, 0, False, [])  # a window shorter than a round
@example(60, 60, 1_079_990, True, [5_000_000] * 50)  # loose, 10 ms before the slip bound
def test_an_admitted_demand_is_allocated_at_its_planned_start(
    start, length, blocker_end_ms, loose, latencies
):
    window = Span(T + timedelta(seconds=start), T + timedelta(seconds=start + length))
    c = cand("a", 3, window, strategy=Strategy.LOOSE if loose else Strategy.STRICT)
    blocker_end = T + timedelta(milliseconds=blocker_end_ms)
    blocker = PlanEntry((L,), Resource.load(3, 1), T - SET.lead_time, blocker_end)
    p = place(c, [blocker], CAP, SET)
    if isinstance(p, PlanRefusal):
        return  # refused at submission: nothing promised
    action, at = _run_rounds(c, p, latencies)
    assert action is Action.ALLOCATE, (action, at, p)
    assert p.start <= at < p.start + SET.round_length


# ----- the plan's use over time in one sweep --------------------------------------------------

_T0 = datetime(2026, 1, 1, tzinfo=UTC)
_MINUTE = st.integers(0, 40).map(lambda m: _T0 + timedelta(minutes=m))
_ENTRY = st.builds(
    lambda start, end, mem, cpu: PlanEntry(("L",), Resource.load(mem, cpu), start, end),
    _MINUTE,
    st.one_of(st.none(), _MINUTE),
    st.integers(0, 9),
    st.integers(0, 9),
)


@given(st.lists(_ENTRY, max_size=30), st.lists(_MINUTE, max_size=12))
@settings(max_examples=300, deadline=None)
def test_in_use_at_sums_the_entries_live_at_each_probe(entries, probes) -> None:
    """The sweep gives, at each probe, the sum of the entries with start <= at < end (an
    entry ending at or before its start never counts), as summing them one by one does."""
    probes = sorted(set(probes))
    swept = list(in_use_at(entries, probes, Resource.load(0, 0)))
    assert [at for at, _ in swept] == probes
    for at, used in swept:
        live = [e for e in entries if e.start <= at and (e.end is None or at < e.end)]
        expected = Resource.load(
            sum(e.resource.get("memory_bytes") for e in live),
            sum(e.resource.get("cpu_millis") for e in live),
        )
        assert used == expected, (at, used, expected)


# ----- parked demands ---------------------------------------------------------------------------


def test_a_parked_demand_is_looked_at_when_its_decision_may_change():
    """park_until: the window's end (then just after), the pass in which ^N runs out, the
    end of a loose slip, the OrderBy bound, else the horizon."""
    strict = view(Span(m(0), m(20)), state=S.ALLOCATING)
    assert park_until(strict, m(5), m(5), SET) == m(20)
    assert park_until(strict, m(20), m(20), SET) == m(20) + EPSILON  # closed: FAIL then
    chances = view(Chances(m(0), 3), state=S.ALLOCATING, rounds=2)
    # Passed over twice: the passes 1 and 2 from here still decide with 2 and 3 rounds.
    assert park_until(chances, m(5), m(5), SET) == m(5) + 3 * SET.round_length
    loose = view(Span(m(0), m(20)), state=S.ALLOCATING, strategy=Strategy.LOOSE)
    slipping = replace(loose, closed_at=m(20))
    assert park_until(slipping, m(21), m(21), SET) == m(35) + EPSILON
    open_ended = view(Span(m(0), None), state=S.ALLOCATING)
    assert park_until(open_ended, m(5), m(5), SET) == m(5) + PARK_HORIZON


@given(st.integers(0, 5), st.integers(0, 3), st.integers(0, 40))
def test_parked_chances_run_out_in_the_pass_the_rounds_would(rounds, chances, passes):
    """A demand passed over `rounds` times, parked: in the pass `passes` later it has
    been passed over rounds + passes - 1 times before its decision, as when each pass
    counted it; park_until wakes it no later than the first pass that decides otherwise."""
    assume(rounds <= chances + 1)  # this round decided with rounds - 1: it still held
    d = view(Chances(m(0), chances), state=S.ALLOCATING, rounds=rounds)
    start = m(1)
    wake = park_until(d, start, start, SET)
    at = start + passes * SET.round_length
    counted = rounds + max(passes_since(start, at + SET.round_length / 2, SET.round_length) - 1, 0)
    assert counted == rounds + max(passes - 1, 0)
    if passes >= 1 and not holds(d.window, at, counted):
        assert wake <= at  # it gets a round in that pass (or an earlier one)
