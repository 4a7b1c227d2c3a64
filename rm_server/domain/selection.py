"""ECM selection: pure, pluggable rules that rank the ECMs a new EngineConn could start on.

Each rule looks at one candidate and returns a :class:`Verdict` (eligible or not, a score in
[0, 1] and a human-readable reason). :func:`rank` combines them:

* a candidate is eligible only if *every* rule finds it eligible;
* its score is the weighted mean ``sum(weight * score) / sum(weight)`` over all rules, so it
  stays in [0, 1]; ineligible candidates score 0;
* eligible candidates come first by score descending, ties broken by instance name; then the
  ineligible ones by instance name. The result depends only on the set of candidates, never on
  their input order, so every RM replica makes the same choice from the same data.

Default weights: labels 1, health 1, resource 3, load 2, standby 6. Labels and health score 1 for
every eligible ECM, so among eligible ECMs only resource (3) and load (2) discriminate; standby's
weight (6) exceeds their sum (5), which makes an established ECM always outrank a recently
registered standby: the standby is used only when no established ECM is eligible.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from labelrm_common.quantity import format_quantity
from rm_server.domain.external import QUEUE_KEY
from rm_server.domain.labels import EC_INSTANCE, EM_INSTANCE, ENGINE_TYPE, USER_CREATOR, Label
from rm_server.domain.resources import (
    CPU,
    KIND_DIMENSIONS,
    MEMORY,
    Resource,
    ResourceKind,
    ResourceTypeError,
    Shortfall,
    fits,
)

RUNNING = "RUNNING"

# These labels describe the engine and its owner, not the machine, so ECMs do not carry them
# (a YARN queue, yarnQueue, is where the engine's executors run: any ECM of its cluster will do).
_NON_PLACEMENT_KEYS = frozenset({USER_CREATOR, ENGINE_TYPE, EC_INSTANCE, QUEUE_KEY})


@dataclass(frozen=True)
class EcmCandidate:
    """One registered ECM as seen by the selection rules at one instant."""

    instance: str
    labels: tuple[Label, ...]
    state: str  # "RUNNING" | "DRAINING" | "LOST"
    allowed: bool  # passes the include/exclude lists
    last_heartbeat: datetime | None
    registered_at: datetime
    total: Resource
    left: Resource  # headroom now: max - used - locked - protected - reserved (model.left_of)
    live_engine_conns: int
    cordoned: bool = False  # an operator stopped new work there (CordonEcm)

    def __post_init__(self) -> None:
        if self.live_engine_conns < 0:
            raise ValueError(f"live_engine_conns must be >= 0, got {self.live_engine_conns}")


@dataclass(frozen=True)
class SelectionRequest:
    """What the new EngineConn needs: its labels, its resource, and the clock."""

    labels: tuple[Label, ...]
    resource: Resource
    now: datetime
    heartbeat_expiry: timedelta = timedelta(seconds=30)
    standby_window: timedelta = timedelta(seconds=60)


@dataclass(frozen=True)
class Verdict:
    """One rule's opinion of one candidate."""

    eligible: bool
    score: float
    reason: str

    def __post_init__(self) -> None:
        # A custom rule returning NaN or 7.0 would silently skew every ranking; refuse it.
        if not (0.0 <= self.score <= 1.0):
            raise ValueError(f"verdict score must be in [0, 1], got {self.score}")


class SelectionRule(Protocol):
    """A selection rule; read-only attributes so frozen dataclasses implement it."""

    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float: ...

    def evaluate(self, c: EcmCandidate, r: SelectionRequest) -> Verdict: ...


@dataclass(frozen=True)
class Choice:
    """One candidate as ranked, with every rule's reason (shown by GetEngineConn)."""

    instance: str
    eligible: bool
    score: float
    reasons: tuple[str, ...]


def _fmt_age(age: timedelta) -> str:
    seconds = max(0.0, age.total_seconds())  # a clock a little ahead reads as "just now"
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


@dataclass(frozen=True)
class LabelMatchRule:
    """Every placement label of the request must be on the ECM; ``emInstance`` pins one ECM."""

    name: str = "labels"
    weight: float = 1.0

    def evaluate(self, c: EcmCandidate, r: SelectionRequest) -> Verdict:
        have = {label.key: label.value for label in c.labels}
        matched: list[str] = []
        for label in sorted(r.labels):
            if label.key in _NON_PLACEMENT_KEYS:
                continue
            if label.key == EM_INSTANCE:
                if label.value != c.instance:
                    return Verdict(False, 0.0, f"labels: {label} pins another ECM")
            elif have.get(label.key) != label.value:
                found = have.get(label.key)
                on_ecm = f"ECM has {label.key}={found}" if found else "ECM lacks it"
                return Verdict(False, 0.0, f"labels: {label} does not match ({on_ecm})")
            matched.append(str(label))
        if not matched:
            return Verdict(True, 1.0, "labels: no placement labels requested")
        verb = "matches" if len(matched) == 1 else "match"
        return Verdict(True, 1.0, f"labels: {', '.join(matched)} {verb}")


@dataclass(frozen=True)
class HealthRule:
    """Only a RUNNING, uncordoned, allowed ECM with a fresh heartbeat can take a new
    EngineConn."""

    name: str = "health"
    weight: float = 1.0

    def evaluate(self, c: EcmCandidate, r: SelectionRequest) -> Verdict:
        if c.state != RUNNING:
            return Verdict(False, 0.0, f"health: state {c.state}")
        if c.cordoned:
            return Verdict(False, 0.0, "health: cordoned (no new work)")
        if not c.allowed:
            return Verdict(False, 0.0, "health: excluded by the include/exclude lists")
        expiry = _fmt_age(r.heartbeat_expiry)
        if c.last_heartbeat is None:
            # A freshly registered agent may not have heartbeated yet; give it one expiry period.
            age = r.now - c.registered_at
            if age > r.heartbeat_expiry:
                return Verdict(
                    False, 0.0, f"health: no heartbeat since registration {_fmt_age(age)} ago"
                )
            return Verdict(True, 1.0, f"health: registered {_fmt_age(age)} ago, no heartbeat yet")
        age = r.now - c.last_heartbeat
        if age > r.heartbeat_expiry:
            return Verdict(
                False, 0.0, f"health: heartbeat stale, {_fmt_age(age)} ago (expiry {expiry})"
            )
        return Verdict(True, 1.0, f"health: heartbeat {_fmt_age(age)} ago")


def ecm_shortfalls(c: EcmCandidate, request: Resource) -> list[Shortfall]:
    """Dimensions of ``request`` that the ECM's headroom cannot cover.

    Same rule as admission.py: the ECM's total limits only the dimensions its kind names (a
    ``load`` ECM says nothing about instances); a SPECIAL total limits every name.
    Incompatible kinds raise ResourceTypeError.
    """
    shortfalls = fits(c.left, request, c.instance)
    if c.total.kind is ResourceKind.SPECIAL:
        return shortfalls
    named = KIND_DIMENSIONS[c.total.kind]
    return [s for s in shortfalls if s.dimension in named]


@dataclass(frozen=True)
class ResourceRule:
    """The request must fit the ECM's headroom; more room left afterwards scores higher."""

    name: str = "resource"
    weight: float = 3.0

    def evaluate(self, c: EcmCandidate, r: SelectionRequest) -> Verdict:
        try:
            shortfalls = ecm_shortfalls(c, r.resource)
        except ResourceTypeError as exc:
            return Verdict(False, 0.0, f"resource: incompatible with the ECM ({exc})")
        if shortfalls:
            parts = [
                f"{s.dimension} requested {format_quantity(s.dimension, s.requested)}, "
                f"available {format_quantity(s.dimension, s.available)}"
                for s in shortfalls
            ]
            return Verdict(False, 0.0, "resource: " + "; ".join(parts))
        fractions: list[float] = []
        free: list[str] = []
        for d in (MEMORY, CPU):
            size = c.total.get(d)
            if d not in c.total.dimensions() or size <= 0:
                continue
            after = max(0, c.left.get(d) - r.resource.get(d))
            fractions.append(min(1.0, after / size))
            free.append(f"{d} {format_quantity(d, after)}")
        # Without memory or CPU there is nothing to prefer: every fitting ECM is equally good.
        score = math.fsum(fractions) / len(fractions) if fractions else 1.0
        detail = f", free after: {', '.join(free)}" if free else ""
        return Verdict(True, score, f"resource: fits{detail}")


@dataclass(frozen=True)
class LoadRule:
    """Fewer live EngineConns on the ECM scores higher: ``1 / (1 + live)``."""

    name: str = "load"
    weight: float = 2.0

    def evaluate(self, c: EcmCandidate, r: SelectionRequest) -> Verdict:
        n = c.live_engine_conns
        noun = "EngineConn" if n == 1 else "EngineConns"
        return Verdict(True, 1.0 / (1 + n), f"load: {n} live {noun}")


@dataclass(frozen=True)
class StandbyRule:
    """An ECM registered less than ``standby_window`` ago is a standby: eligible, scored 0.

    A just-started agent may still be warming up or may be flapping; prefer established ECMs.
    """

    name: str = "standby"
    weight: float = 6.0

    def evaluate(self, c: EcmCandidate, r: SelectionRequest) -> Verdict:
        age = r.now - c.registered_at
        if age < r.standby_window:
            return Verdict(True, 0.0, f"standby: registered {_fmt_age(age)} ago (standby)")
        return Verdict(True, 1.0, f"standby: registered {_fmt_age(age)} ago (established)")


DEFAULT_RULES: tuple[SelectionRule, ...] = (
    LabelMatchRule(),
    HealthRule(),
    ResourceRule(),
    LoadRule(),
    StandbyRule(),
)


def _choose(c: EcmCandidate, r: SelectionRequest, rules: Sequence[SelectionRule]) -> Choice:
    verdicts = [rule.evaluate(c, r) for rule in rules]
    eligible = all(v.eligible for v in verdicts)
    total_weight = math.fsum(rule.weight for rule in rules)
    score = 0.0
    if eligible and total_weight > 0:
        weighted = math.fsum(rule.weight * v.score for rule, v in zip(rules, verdicts, strict=True))
        score = min(1.0, weighted / total_weight)
    return Choice(c.instance, eligible, score, tuple(v.reason for v in verdicts))


def rank(
    candidates: Iterable[EcmCandidate],
    request: SelectionRequest,
    rules: Sequence[SelectionRule] = DEFAULT_RULES,
) -> list[Choice]:
    """Every candidate, ranked: eligible ones best first, then the ineligible ones.

    Raises ValueError on duplicate instance names (the order would then depend on the input
    order) or on a rule with a negative or non-finite weight.
    """
    for rule in rules:
        if not (math.isfinite(rule.weight) and rule.weight >= 0):
            raise ValueError(f"rule {rule.name!r} has invalid weight {rule.weight}")
    choices = [_choose(c, request, rules) for c in candidates]
    instances = [c.instance for c in choices]
    if len(set(instances)) != len(instances):
        dupes = sorted({i for i in instances if instances.count(i) > 1})
        raise ValueError(f"duplicate ECM instances: {', '.join(dupes)}")
    return sorted(choices, key=lambda ch: (not ch.eligible, -ch.score, ch.instance))
