"""Abuse limits, checked before a request reaches its servicer (so a refusal changes
nothing): a per-user rate on every user RPC and a stricter one on the apply-like RPCs
(token buckets), the same per-user rate on the calls of each user's EngineConns
together (their certificates are the user's too), a per-user cap on Applies waiting
for capacity, a per-peer throttle on failed authentications (invalid credentials only),
and a per-peer cap on the open streams of the public health Watch.

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
from rm_server.security.identity import Kind, Principal
from rm_server.security.policy import Owners

RATE_LIMITED = "RATE_LIMITED"
TOO_MANY_WAITING = "TOO_MANY_WAITING"
TOO_MANY_AUTH_FAILURES = "TOO_MANY_AUTH_FAILURES"
TOO_MANY_STREAMS = "TOO_MANY_STREAMS"

# Bounds on the bookkeeping itself: an attacker rotating source addresses or users
# must not grow these tables without end (the oldest entries are dropped).
MAX_TRACKED_PEERS = 50_000
MAX_TRACKED_USERS = 50_000


@dataclass(frozen=True)
class LimitSettings:
    apply_rate: float = 50.0  # apply-like calls per second and user; 0 = unlimited
    apply_burst: int = 100
    call_rate: float = 200.0  # calls of any user RPC per second and user; 0 = unlimited
    call_burst: int = 400
    max_watch_streams: int = 16  # open health Watch streams per peer address; 0 = unlimited
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
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()  # apply-like calls
        self._calls: OrderedDict[str, _Bucket] = OrderedDict()  # every user RPC
        self._engine_calls: OrderedDict[str, _Bucket] = OrderedDict()  # by EC owner
        self._streams: dict[str, int] = {}  # open health Watch streams per peer
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
        _take(
            self._buckets, user, st.apply_rate, st.apply_burst, self._clock(),
            f"user {user!r} exceeds {st.apply_rate:g} applies per second (apply_rate",
        )  # fmt: skip

    def admit_call(self, user: str) -> None:
        """Count one call of any user RPC by `user`, or raise ResourceExhausted: one user's
        flood of cheap calls must not starve the others (nor the health checks)."""
        st = self.settings
        if st.call_rate > 0:
            _take(
                self._calls, user, st.call_rate, st.call_burst, self._clock(),
                f"user {user!r} exceeds {st.call_rate:g} calls per second (call_rate",
            )  # fmt: skip

    def admit_engine_call(self, owner: str, who: str = "") -> None:
        """Count one call by an EngineConn of `owner`, or raise ResourceExhausted. All of a
        user's EngineConns share one bucket of `call_rate`: a user holds the certificates
        of their EngineConns, and must not flood the database through them. The bucket
        is apart from the user's own calls, so that a user's busy script does not keep
        their EngineConns from reporting (a refused first report ends an EngineConn).
        `who` names the bucket in the refusal (default: the EngineConns of `owner`)."""
        st = self.settings
        if st.call_rate > 0:
            who = who or f"the EngineConns of user {owner!r}"
            _take(
                self._engine_calls, owner, st.call_rate, st.call_burst, self._clock(),
                f"{who} exceed {st.call_rate:g} calls per second together (call_rate",
            )  # fmt: skip

    def open_stream(self, peer: str) -> Callable[[], None]:
        """Count one open public stream (health Watch) of `peer`, or raise
        ResourceExhausted; the returned function closes it."""
        limit = self.settings.max_watch_streams
        if limit <= 0:
            return _nothing
        held = self._streams.get(peer, 0)
        if held >= limit:
            raise ResourceExhausted(
                f"{limit} health Watch streams already open from {peer} (max_watch_streams)",
                reason=TOO_MANY_STREAMS,
            )
        self._streams[peer] = held + 1
        done = False

        def close() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self._streams.get(peer, 1) - 1
            if left > 0:
                self._streams[peer] = left
            else:
                self._streams.pop(peer, None)

        return close

    def waiting(self, user: str) -> int:
        return self._waiting.get(user, 0)


def _take(
    buckets: OrderedDict[str, _Bucket],
    user: str,
    rate: float,
    burst: int,
    now: float,
    exceeds: str,
) -> None:
    """Take one token of `user`'s bucket (refilled at `rate` per second up to `burst`);
    `exceeds` opens the refusal's message (who exceeds what, and the setting's name)."""
    bucket = buckets.get(user)
    if bucket is None:
        bucket = buckets[user] = _Bucket(float(burst), now)
        while len(buckets) > MAX_TRACKED_USERS:
            buckets.popitem(last=False)
    buckets.move_to_end(user)
    refill = (now - bucket.stamp) * rate
    bucket.tokens = min(float(burst), bucket.tokens + refill)
    bucket.stamp = now
    if bucket.tokens < 1.0:
        wait = (1.0 - bucket.tokens) / rate
        raise ResourceExhausted(
            f"{exceeds}, burst {burst}): retry in {wait:.2f} s", reason=RATE_LIMITED
        )
    bucket.tokens -= 1.0


class RateKeys:
    """Whose call rate a caller's calls count against: a user's own; an EngineConn's,
    its owner's EngineConns' together (its own when it has no row any more); none for
    admins and agents (trusted, and exempt).

    An EngineConn's owner is read once and kept: an EngineConn certificate names an id
    the RM created and never reuses, whose owner never changes, so neither does the
    answer (no row: its row was purged, and no row of that id comes back)."""

    def __init__(self, owners: Owners, capacity: int = MAX_TRACKED_USERS) -> None:
        self._owners = owners
        self._capacity = capacity
        self._ec_owners: OrderedDict[str, str] = OrderedDict()

    async def admit(self, limits: Limits, principal: Principal) -> None:
        """Count one call of `principal` against its rate, or raise ResourceExhausted."""
        if principal.is_admin:
            return
        if principal.kind is Kind.USER:
            limits.admit_call(principal.name)
        elif principal.kind is Kind.ENGINECONN:
            owner = await self._owner_of(principal.name)
            if owner:
                limits.admit_engine_call(owner)
            else:  # a bucket of its own, under a key no user name can take
                limits.admit_engine_call(
                    f"/engineconn/{principal.name}", f"EngineConn {principal.name!r} (no owner)"
                )

    async def _owner_of(self, ec_id: str) -> str:
        """The owner of EngineConn `ec_id` ("" when it has no row)."""
        owner = self._ec_owners.get(ec_id)
        if owner is None:
            owner = await self._owners.engine_conn_owner(ec_id) or ""
            self._ec_owners[ec_id] = owner
            while len(self._ec_owners) > self._capacity:
                self._ec_owners.popitem(last=False)
        self._ec_owners.move_to_end(ec_id)
        return owner


def _nothing() -> None:
    return None
