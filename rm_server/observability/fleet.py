"""What the fleet looks like, read from the shared database at scrape time (cached):
ECMs and EngineConns by state, and the liveness judge's state (rm_server/app/liveness.py).
Every replica reports the same values. Registered by `Metrics.attach_states` and
`Metrics.attach_liveness` (rm_server/observability/metrics.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rm_server.domain.liveness import LivenessView
from rm_server.observability.scrape import ScrapeCache

log = logging.getLogger(__name__)


class StateSource(Protocol):
    async def state_counts(self) -> dict[str, dict[str, int]]: ...


ECM_STATES = ("RUNNING", "DRAINING", "LOST")
EC_STATES = ("STARTING", "IDLE", "BUSY", "SHUTTING_DOWN", "SUCCEEDED", "FAILED", "LOST")


class StateCountCollector(Collector):
    """``labelrm_ecms{state}`` and ``labelrm_engine_conns{state}``, read at scrape time
    (cached like the label records); every state is exported, zero included."""

    def __init__(self, source: StateSource, cache_seconds: float) -> None:
        empty: dict[str, dict[str, int]] = {"ecm": {}, "engine_conn": {}}
        self._counts = ScrapeCache(source.state_counts, empty, cache_seconds, "state counts")
        self.refresh = self._counts.refresh

    def collect(self) -> Iterable[Metric]:
        for name, key, states, help_text in (
            ("labelrm_ecms", "ecm", ECM_STATES, "Registered ECMs by state."),
            ("labelrm_engine_conns", "engine_conn", EC_STATES, "EngineConns by state."),
        ):
            family = GaugeMetricFamily(name, help_text, labels=["state"])
            for state in states:
                family.add_metric([state], self._counts.value.get(key, {}).get(state, 0))
            yield family


class LivenessSource(Protocol):
    async def liveness(self) -> LivenessView: ...


class LivenessCollector(Collector):
    """The liveness judge's state (shared by the replicas, read at scrape time, cached):
    ``labelrm_liveness_disrupted`` (1 during a suspected disruption), the silent and
    counted agents, and as Unix times the heard-since mark, when agents and EngineConns
    are judged again (``{kind}``) and the judge's last pass (docs/operations.md)."""

    def __init__(self, source: LivenessSource, cache_seconds: float) -> None:
        self._view = ScrapeCache[LivenessView | None](
            source.liveness, None, cache_seconds, "the liveness state"
        )
        self.refresh = self._view.refresh
        self.expire = self._view.expire

    def collect(self) -> Iterable[Metric]:
        view = self._view.value
        if view is None:
            return
        rec = view.record
        yield GaugeMetricFamily(
            "labelrm_liveness_disrupted",
            "1 while a large share of the agents is silent at once (a suspected disruption:"
            " nothing is declared LOST), else 0.",
            value=int(rec.disrupted_since is not None),
        )
        for name, value, text in (
            ("silent_agents", rec.silent_agents, "Agents silent at the judge's last count."),
            ("agents", rec.agents, "Agents not LOST at the judge's last count."),
            ("heard_since_timestamp_seconds", rec.heard_since.timestamp(),
             "Silence counts from this Unix time on (the RM began to hear again then)."),
        ):  # fmt: skip
            yield GaugeMetricFamily(f"labelrm_liveness_{name}", text, value=value)
        judged = GaugeMetricFamily(
            "labelrm_liveness_judged_from_timestamp_seconds",
            "Unix time from which agents, and EngineConns, are judged silent again.",
            labels=["kind"],
        )
        judged.add_metric(["agents"], view.agents_judged_from.timestamp())
        judged.add_metric(["engine_conns"], view.engine_conns_judged_from.timestamp())
        yield judged
        if rec.judged_at is not None:
            yield GaugeMetricFamily(
                "labelrm_liveness_last_pass_timestamp_seconds",
                "Unix time of the liveness judge's last pass.",
                value=rec.judged_at.timestamp(),
            )
