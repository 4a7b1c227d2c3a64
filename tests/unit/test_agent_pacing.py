"""The agent's heartbeat pacing (ecm_agent/pacing.py): bounded, jittered, a slow answer
does not move the phase, and a herd formed by a stall is spread over one interval."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from ecm_agent.pacing import JITTER, next_beat_delay

intervals = st.floats(min_value=0.01, max_value=600, allow_nan=False)
draws = st.floats(min_value=0, max_value=1, exclude_max=True)


@given(intervals, st.floats(min_value=0, max_value=10_000, allow_nan=False), draws)
def test_never_waits_past_the_jittered_interval(interval: float, took: float, u: float) -> None:
    delay = next_beat_delay(interval, took, u)
    assert 0 <= delay <= interval * (1 + JITTER)


@given(intervals, st.floats(min_value=0, max_value=1, exclude_max=True), draws)
def test_the_next_beat_is_due_an_interval_after_the_last_was_sent(
    interval: float, fraction: float, u: float
) -> None:
    took = interval * fraction
    due = took + next_beat_delay(interval, took, u)
    assert interval * (1 - JITTER) - 1e-9 <= due <= interval * (1 + JITTER) + 1e-9
    if took <= interval * (1 - JITTER):  # the answer's latency does not move the phase
        assert abs(due - interval * (1 + JITTER * (2 * u - 1))) < 1e-9 * interval


@given(intervals, st.floats(min_value=1, max_value=100, allow_nan=False), draws)
def test_a_slow_answer_waits_a_part_of_one_interval(
    interval: float, times: float, u: float
) -> None:
    assert next_beat_delay(interval, interval * times, u) < interval


def test_jitter_keeps_the_mean_interval_and_a_stall_spreads_the_herd() -> None:
    grid = [i / 1000 for i in range(1000)]
    ordinary = [0.01 + next_beat_delay(3.0, 0.01, u) for u in grid]
    assert abs(statistics.fmean(ordinary) - 3.0) < 0.01
    assert max(ordinary) - min(ordinary) > 0.5  # phases drift apart
    herd = [next_beat_delay(3.0, 4.0, u) for u in grid]
    # the herd a stall released lands evenly over the next interval: no tenth of it
    # holds more than a tenth (and a bit) of the agents
    tenths = [sum(1 for d in herd if k * 0.3 <= d < (k + 1) * 0.3) for k in range(10)]
    assert max(tenths) <= 101 and min(tenths) >= 99
