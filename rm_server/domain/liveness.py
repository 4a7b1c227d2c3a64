"""When the liveness judge may call an agent or an EngineConn silent (pure rules).

Silence proves something only while the RM could hear. A pause of the RM itself (its
event loop blocked, the process stopped, a restart, its database away) looks from the
inside exactly like every agent falling silent, so silence counts only from the last
moment the RM began to hear again, its *heard-since mark*: every agent and EngineConn
gets a fresh grace window of one expiry after it, as Nomad resets every node's
heartbeat TTL after a leader election (its `failover_heartbeat_ttl`).

And when a large share of the agents falls silent at once, the likelier culprit is the
RM's side (its network, its host) rather than the agents: like the Kubernetes node
lifecycle controller, which stops evicting when a zone is fully disrupted (a zone is
unhealthy when at least `--unhealthy-zone-threshold` 55 % of its nodes, and at least 3,
are not ready), the judge then declares nobody LOST. The minimum count keeps the rule
from sparing a single dead agent in a small fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

# Kubernetes' defaults: --unhealthy-zone-threshold and its "(minimum 3)" nodes.
DEFAULT_DISRUPTION_SHARE = 0.55
DEFAULT_DISRUPTION_MIN_AGENTS = 3


@dataclass(frozen=True)
class LivenessRules:
    """The judge's tunables (from the server's settings)."""

    ecm_expiry: timedelta
    ec_expiry: timedelta
    # A STARTING EngineConn not ready after this long failed to start.
    start_timeout: timedelta
    # Seconds between the checks that prove the RM hears (the sweep interval).
    interval: float
    disruption_share: float = DEFAULT_DISRUPTION_SHARE
    disruption_min_agents: int = DEFAULT_DISRUPTION_MIN_AGENTS

    @property
    def stall_after(self) -> float:
        """Seconds between two successful checks beyond which the RM counts as having
        not heard meanwhile: the interval plus a quarter of the shorter expiry. A live
        agent's silence grows by at most that much from a stall shorter than this, and
        the other three quarters still hold several of its beats."""
        return self.interval + min(self.ecm_expiry, self.ec_expiry).total_seconds() / 4


def stalled(last_heard: float, now: float, rules: LivenessRules) -> bool:
    """Whether a check that succeeded at `now` (a monotonic clock's seconds) ends a time
    the RM could not hear: the previous successful check, at `last_heard`, is longer ago
    than `rules.stall_after`."""
    return now - last_heard > rules.stall_after


@dataclass(frozen=True)
class Cutoffs:
    """What one pass of the judge may decide at `now`, given the heard-since mark.

    `agents`: an agent whose last beat is older is silent past the expiry; `suspect`:
    one whose last beat is older is counted silent when the judge weighs a disruption
    (half the expiry: agents that stopped together have all passed it by the time the
    first of them passes the expiry). `engine_conns` and `starts` likewise for
    EngineConns' reports and for starts not ready in time. Each is None while its
    grace window after the mark lasts: nothing of that kind is judged then."""

    agents: datetime | None
    suspect: datetime | None
    engine_conns: datetime | None
    starts: datetime | None


def cutoffs(now: datetime, heard_since: datetime, rules: LivenessRules) -> Cutoffs:
    """The cutoffs of a pass at `now`: silence counts only after `heard_since`, so a
    cutoff exists only once one full window has passed since it."""
    agents = now - rules.ecm_expiry
    engine_conns = now - rules.ec_expiry
    if heard_since > agents:
        agent_cuts: tuple[datetime | None, datetime | None] = (None, None)
    else:
        agent_cuts = (agents, now - rules.ecm_expiry / 2)
    if heard_since > engine_conns:
        return Cutoffs(*agent_cuts, None, None)
    return Cutoffs(*agent_cuts, engine_conns, now - rules.start_timeout)


def judged_from(heard_since: datetime, rules: LivenessRules) -> tuple[datetime, datetime]:
    """When agents, and when EngineConns, can be judged again after `heard_since`."""
    return heard_since + rules.ecm_expiry, heard_since + rules.ec_expiry


def is_disruption(agents: int, silent: int, rules: LivenessRules) -> bool:
    """Whether `silent` of `agents` (those not LOST) silent at once point at the RM's
    side: at least `disruption_min_agents` of them, and at least `disruption_share`."""
    return silent >= rules.disruption_min_agents and silent >= rules.disruption_share * agents


class Episode(Enum):
    """How a pass changed the disruption state (one log line per change, not per pass)."""

    UNCHANGED = "unchanged"
    BEGAN = "began"
    ENDED = "ended"


def next_disruption(
    since: datetime | None, disrupted: bool, now: datetime
) -> tuple[datetime | None, Episode]:
    """The disruption's start after a pass at `now` that found the fleet `disrupted` or
    not, given its start `since` before the pass (None: there was none)."""
    if disrupted:
        return (since, Episode.UNCHANGED) if since is not None else (now, Episode.BEGAN)
    return (None, Episode.ENDED) if since is not None else (None, Episode.UNCHANGED)


@dataclass(frozen=True)
class LivenessRecord:
    """The judge's shared state (one row, whichever replica judges): the heard-since
    mark and why it is there, the judge's last pass (and its replica id: "" since a
    replica started), and the disruption it sees."""

    heard_since: datetime
    heard_since_reason: str
    judged_at: datetime | None = None
    disrupted_since: datetime | None = None
    silent_agents: int = 0
    agents: int = 0
    judge: str = ""


@dataclass(frozen=True)
class LivenessView:
    """The judge's state as operators see it (GetClusterInfo, `rmctl status`, metrics)."""

    record: LivenessRecord
    agents_judged_from: datetime
    engine_conns_judged_from: datetime

    @staticmethod
    def of(record: LivenessRecord, rules: LivenessRules) -> LivenessView:
        agents, engine_conns = judged_from(record.heard_since, rules)
        return LivenessView(record, agents, engine_conns)
