"""Seconds (a float) to a protobuf Duration, one rounding for the server, agent and clients.

`duration.proto` stores a span as whole `seconds` plus `nanos` (-999,999,999 ..
999,999,999) carrying the sign of `seconds`. A float of seconds is split here, rounded to
the nearest nanosecond (ties to even, Python's `round`): 0.3 s is 300,000,000 ns, where
truncating `0.3 * 1e9` (299,999,999.99999994) would lose one. The whole seconds are taken
before scaling, so large spans keep their nanoseconds as exactly as the float allows.
"""

from __future__ import annotations

import math

from google.protobuf.duration_pb2 import Duration

NANOS_PER_SECOND = 1_000_000_000


def seconds_to_parts(seconds: float) -> tuple[int, int]:
    """(seconds, nanos) of a span in seconds, rounded to the nearest nanosecond; both parts
    carry the span's sign. ValueError for NaN and infinities."""
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, got {seconds!r}")
    sign = -1 if seconds < 0 else 1
    whole, frac = divmod(abs(seconds), 1)
    nanos = round(frac * NANOS_PER_SECOND)
    if nanos == NANOS_PER_SECOND:  # 0.9999999999 s rounds up to the next second
        whole, nanos = whole + 1, 0
    return sign * int(whole), sign * nanos


def duration(seconds: float) -> Duration:
    """A google.protobuf.Duration of `seconds` (see `seconds_to_parts` for the rounding)."""
    whole, nanos = seconds_to_parts(seconds)
    return Duration(seconds=whole, nanos=nanos)
