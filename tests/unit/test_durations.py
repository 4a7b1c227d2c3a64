"""labelrm_common.durations: seconds to a protobuf Duration, rounded to the nanosecond."""

from __future__ import annotations

import math

import pytest

from labelrm_common.durations import duration, seconds_to_parts


@pytest.mark.parametrize(
    ("seconds", "parts"),
    [
        (0, (0, 0)),
        (30, (30, 0)),
        (0.3, (0, 300_000_000)),  # 0.3 * 1e9 is 299,999,999.99999994: truncation loses 1
        (1.5, (1, 500_000_000)),
        (2.9999999999, (3, 0)),  # rounds up into the next second
        (1e-9, (0, 1)),
        (-1.5, (-1, -500_000_000)),  # both parts carry the sign (duration.proto)
        (315_576_000_000, (315_576_000_000, 0)),
    ],
)
def test_seconds_to_parts(seconds: float, parts: tuple[int, int]) -> None:
    assert seconds_to_parts(seconds) == parts


def test_duration_message() -> None:
    d = duration(0.3)
    assert (d.seconds, d.nanos) == (0, 300_000_000)
    assert d.ToNanoseconds() == 300_000_000


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_is_rejected(bad: float) -> None:
    with pytest.raises(ValueError):
        seconds_to_parts(bad)
