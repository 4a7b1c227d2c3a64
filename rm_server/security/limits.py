"""Abuse limits, checked before a request reaches its servicer (so a refusal changes
nothing): a per-user rate on the apply-like RPCs (a token bucket), a per-user cap on
Applies waiting for capacity, and a per-peer throttle on failed authentications.

The counters live in each RM process: with N replicas behind a balancer a user gets
up to N times the rate. They bound abuse, they are not a fair-share scheduler.
Admins (and everyone in dev mode, where authentication is off) are exempt.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from rm_server.errors import ResourceExhausted

RATE_LIMITED = "RATE_LIMITED"
TOO_MANY_WAITING = "TOO_MANY_WAITING"
TOO_MANY_AUTH_FAILURES = "TOO_MANY_AUTH_FAILURES"

# Bounds on the bookkeeping itself: an attacker rotating source addresses or users
# must not grow these tables without end (the oldest entries are dropped).
MAX_TRACKED_PEERS = 50_000
MAX_TRACKED_USERS = 50_000


@dataclass(frozen=True)
class LimitSettings:
    apply_rate: float = 50.0  # apply-like calls per second and user; 0 = unlimited
    apply_burst: int = 100
    max_waiting_applies: int = 32  # per user; 0 = unlimited
    auth_failure_limit: int = 10  # failed authentications per peer within the window
    auth_failure_window: float = 60.0


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class Limits:
    """The limits of one RM process."""

    def __init__(
        self, settings: LimitSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._waiting: dict[str, int] = {}
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    # ----- failed authentications --------------------------------------------------------

    def _recent_failures(self, peer: str) -> deque[float] | None:
        failures = self._failures.get(peer)
        if failures is None:
            return None
        horizon = self._clock() - self.settings.auth_failure_window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            del self._failures[peer]
            return None
        return failures

    def check_peer(self, peer: str) -> None:
        """Refuse a peer with too many recent failures, without looking at what it sent."""
        limit = self.settings.auth_failure_limit
        failures = self._recent_failures(peer)
        if limit > 0 and failures is not None and len(failures) >= limit:
            retry = failures[0] + self.settings.auth_failure_window - self._clock()
            raise ResourceExhausted(
                f"too many failed authentications from {peer}: try again in {retry:.0f} s",
                reason=TOO_MANY_AUTH_FAILURES,
            )

    def auth_failed(self, peer: str) -> None:
        failures = self._recent_failures(peer)
        if failures is None:
            failures = self._failures[peer] = deque(maxlen=max(1, self.settings.auth_failure_limit))
        self._failures.move_to_end(peer)
        failures.append(self._clock())
        while len(self._failures) > MAX_TRACKED_PEERS:
            self._failures.popitem(last=False)

    # ----- apply-like calls ----------------------------------------------------------------

    def admit(self, user: str, waiting: bool) -> Callable[[], None]:
        """Admit one apply-like call of `user` (which waits for capacity if `waiting`),
        or raise ResourceExhausted. The returned function ends the call's stay."""
        st = self.settings
        limit = st.max_waiting_applies
        if waiting and limit > 0 and self._waiting.get(user, 0) >= limit:
            raise ResourceExhausted(
                f"user {user!r} already has {limit} applies waiting for capacity"
                " (max_waiting_applies)",
                reason=TOO_MANY_WAITING,
            )
        if st.apply_rate > 0:
            self._take(user)
        if not waiting or st.max_waiting_applies <= 0:
            return _nothing
        self._waiting[user] = self._waiting.get(user, 0) + 1
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self._waiting.get(user, 1) - 1
            if left > 0:
                self._waiting[user] = left
            else:
                self._waiting.pop(user, None)

        return release

    def _take(self, user: str) -> None:
        st = self.settings
        now = self._clock()
        bucket = self._buckets.get(user)
        if bucket is None:
            bucket = self._buckets[user] = _Bucket(float(st.apply_burst), now)
            while len(self._buckets) > MAX_TRACKED_USERS:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(user)
        refill = (now - bucket.stamp) * st.apply_rate
        bucket.tokens = min(float(st.apply_burst), bucket.tokens + refill)
        bucket.stamp = now
        if bucket.tokens < 1.0:
            wait = (1.0 - bucket.tokens) / st.apply_rate
            raise ResourceExhausted(
                f"user {user!r} exceeds {st.apply_rate:g} applies per second"
                f" (apply_rate, burst {st.apply_burst}): retry in {wait:.2f} s",
                reason=RATE_LIMITED,
            )
        bucket.tokens -= 1.0

    def waiting(self, user: str) -> int:
        return self._waiting.get(user, 0)


def _nothing() -> None:
    return None
