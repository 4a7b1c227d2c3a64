"""When the agent beats next: one interval after it sent the last beat, give or take a
jitter, whatever the answer's latency.

Thousands of agents beating on one RM must not line up, or every beat of the herd waits
behind the rest of it. Two things line agents up: starting together, and an RM stall,
after which the RM answers all the beats it held back at once. Waiting a fixed delay
after each answer would copy that burst of answers into every later interval. So:

- the next beat is due one interval, give or take `JITTER` of it, after the last one
  was sent: a slow answer does not move an agent's phase, and the jitter keeps phases
  from locking;
- if the answer took an interval or more (the RM stalled, or the beat was retried), the
  next beat goes at a random point of the next interval: the herd the stall formed is
  spread over one interval at once (the idea of "full jitter" in retry back-off).

No wait is longer than (1 + JITTER) * interval, so the RM's expiry margin is kept.
bench/nodejs/heartbeat.cjs simulates agents with the same rule.
"""

from __future__ import annotations

JITTER = 0.1


def next_beat_delay(interval: float, took: float, u: float) -> float:
    """Seconds from an answer to the next beat. `took`: how long the beat took from its
    first send to its answer (retries included); `u`: a uniform draw from [0, 1)."""
    if took >= interval:
        return u * interval
    return max(0.0, interval * (1 + JITTER * (2 * u - 1)) - took)
