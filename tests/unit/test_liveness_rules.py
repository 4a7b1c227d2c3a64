"""The liveness judge's rules (rm_server/domain/liveness.py): silence counts only while
the RM could hear, and many agents silent at once are a suspected disruption."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.liveness import (
    DEFAULT_DISRUPTION_MIN_AGENTS,
    Episode,
    LivenessRules,
    cutoffs,
    is_disruption,
    next_disruption,
    stalled,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rules(
    expiry: float = 30.0, interval: float = 1.0, ec_expiry: float | None = None
) -> LivenessRules:
    return LivenessRules(
        ecm_expiry=timedelta(seconds=expiry),
        ec_expiry=timedelta(seconds=expiry if ec_expiry is None else ec_expiry),
        start_timeout=timedelta(seconds=90),
        interval=interval,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_defaults_are_kubernetes_unhealthy_zone_threshold():
    r = rules()
    assert (r.disruption_share, r.disruption_min_agents) == (0.55, 3)
    assert not is_disruption(agents=2, silent=2, rules=r)  # the whole of a small fleet
    assert is_disruption(agents=5, silent=3, rules=r)
    assert not is_disruption(agents=6, silent=3, rules=r)  # 50 %
    assert is_disruption(agents=1000, silent=550, rules=r)


def test_grace_windows_follow_the_mark():
    r = rules(expiry=30, ec_expiry=60)
    cut = cutoffs(at(100), heard_since=at(80), rules=r)
    assert cut == cutoffs(at(100), at(80), r) and cut.agents is None and cut.engine_conns is None
    cut = cutoffs(at(110), heard_since=at(80), rules=r)  # agents' window over, not EngineConns'
    assert cut.agents == at(80) and cut.suspect == at(95) and cut.engine_conns is None
    cut = cutoffs(at(140), heard_since=at(80), rules=r)
    assert cut.engine_conns == at(80) and cut.starts == at(50)


@given(
    now=st.floats(0, 1e6),
    mark=st.floats(0, 1e6),
    last_beat=st.floats(0, 1e6),
    expiry=st.floats(0.5, 3600),
)
def test_nothing_is_judged_on_silence_before_the_mark(now, mark, last_beat, expiry):
    """An agent is judged silent only when it was silent for a full expiry counted from
    the later of its last beat and the mark; and once judgeable it stays so."""
    r = rules(expiry)
    cut = cutoffs(at(now), at(mark), r)
    if cut.agents is not None and at(last_beat) < cut.agents:
        assert at(now) - max(at(last_beat), at(mark)) > r.ecm_expiry - timedelta(microseconds=1)
        later = cutoffs(at(now + 1), at(mark), r)
        assert later.agents is not None and at(last_beat) < later.agents
    if cut.agents is None:
        assert at(mark) > at(now) - r.ecm_expiry


@given(
    expiry=st.floats(5, 120),
    interval_share=st.floats(0.005, 0.1),
    beat_share=st.floats(0.01, 0.2),
    phase=st.floats(0, 1),
    stall_at=st.floats(0, 3),
    stall_for=st.floats(0, 5),
)
def test_a_live_agent_is_never_judged_whatever_the_rm_stall(
    expiry, interval_share, beat_share, phase, stall_at, stall_for
):
    """A simulation: the RM checks that it hears every interval and judges at each check;
    an agent beats every `beat` seconds, and a beat sent while the RM is stalled is lost.
    However long the stall (none at all, one shorter than the rules notice, or many
    expiries), the live agent is never found silent past the expiry."""
    interval, beat = interval_share * expiry, beat_share * expiry
    r = rules(expiry, interval)
    stall_start, stall_end = stall_at * expiry, (stall_at + stall_for) * expiry
    heard_since = last_check = last_beat = 0.0  # the RM starts, the agent registers
    next_beat = phase * beat
    horizon = stall_end + 3 * expiry
    check = interval
    while check < horizon:
        if stall_start <= check < stall_end:
            check = stall_end  # the loop's timers fire when the process runs again
        while next_beat <= check:
            if not stall_start <= next_beat < stall_end:
                last_beat = next_beat
            next_beat += beat
        if stalled(last_check, check, r):
            heard_since = check
        last_check = check
        cut = cutoffs(at(check), at(heard_since), r)
        assert cut.agents is None or at(last_beat) >= cut.agents, (check, last_beat, heard_since)
        check += interval


@given(
    expiry=st.floats(5, 120),
    interval_share=st.floats(0.005, 0.1),
    died=st.floats(0, 10),
)
def test_a_dead_agent_is_judged_one_expiry_after_its_last_beat(expiry, interval_share, died):
    """The control: with the RM hearing all along, an agent that stops beating is found
    silent by the checks one expiry after its last beat (the second one at the latest:
    the first may come at that very instant)."""
    interval = interval_share * expiry
    r = rules(expiry, interval)
    last_beat = died * expiry
    first = (math.floor((last_beat + expiry) / interval) + 2) * interval
    for check in (first, first + interval):
        cut = cutoffs(at(check), at(0), r)
        assert cut.agents is not None and at(last_beat) < cut.agents
    assert not stalled(first - interval, first, r)


@given(gap=st.floats(0, 1e5), interval=st.floats(0.01, 60), expiry=st.floats(0.5, 600))
def test_a_gap_is_a_stall_only_past_the_interval_and_a_quarter_expiry(gap, interval, expiry):
    r = rules(expiry, interval)
    assert stalled(100.0, 100.0 + gap, r) == (gap > interval + expiry / 4)


@given(agents=st.integers(0, 100_000), silent=st.integers(0, 100_000))
def test_fewer_than_the_minimum_silent_are_never_a_disruption(agents, silent):
    """A single dead agent is LOST whatever the size of the fleet; and a disruption stays
    one when more agents fall silent, or the fleet is smaller."""
    silent = min(silent, agents)
    r = rules()
    if silent < DEFAULT_DISRUPTION_MIN_AGENTS:
        assert not is_disruption(agents, silent, r)
    if is_disruption(agents, silent, r):
        assert is_disruption(agents, min(agents, silent + 1), r)
        assert is_disruption(max(silent, agents - 1), silent, r)


@given(st.lists(st.booleans(), max_size=60))
def test_one_line_per_episode(passes):
    """Over any sequence of passes, a disruption begins once per run of disrupted passes
    and ends once when the run ends: never a line per pass."""
    since = None
    events = []
    for i, disrupted in enumerate(passes):
        since, episode = next_disruption(since, disrupted, at(i))
        assert (since is not None) == disrupted
        if episode is not Episode.UNCHANGED:
            events.append(episode)
    runs = sum(1 for i, d in enumerate(passes) if d and (i == 0 or not passes[i - 1]))
    assert events.count(Episode.BEGAN) == runs
    assert events.count(Episode.ENDED) == runs - (1 if passes and passes[-1] else 0)
    assert all(a is not b for a, b in itertools.pairwise(events))
