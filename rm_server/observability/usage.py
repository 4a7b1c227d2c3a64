"""``labelrm_engine_conn_resource{ecm, kind, dimension}``: per ECM, over its live
EngineConns, what they asked for (``requested``), what their tickets charge and their
agent holds them to (``granted``), and what their agent measured from their cgroups
(``measured``), side by side. Dimensions: ``memory_bytes`` and ``cpu_millis`` for all
three; ``memory_peak_bytes`` and ``cpu_time_seconds`` for ``measured``.

Per ECM, not per EngineConn: label values stay bounded (at most `cap` ECMs, in instance
order). Read at scrape time and cached like the label records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rm_server.domain.engineconn import EcmUsage
from rm_server.observability.scrape import ScrapeCache

log = logging.getLogger(__name__)


class UsageSource(Protocol):
    async def usage_by_ecm(self, limit: int) -> list[EcmUsage]: ...


class EngineConnUsageCollector(Collector):
    """See the module docstring."""

    def __init__(self, source: UsageSource, cap: int, cache_seconds: float) -> None:
        self.cap = max(0, cap)
        self._rows = ScrapeCache[list[EcmUsage]](
            lambda: source.usage_by_ecm(self.cap), [], cache_seconds, "EngineConn usage"
        )
        self.refresh = self._rows.refresh

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "labelrm_engine_conn_resource",
            "Over an ECM's live EngineConns: requested, granted (what their agent enforces)"
            " and measured (from their cgroups) resource, by dimension.",
            labels=["ecm", "kind", "dimension"],
        )
        for row in self._rows.value:
            for kind, dimension, value in (
                ("requested", "memory_bytes", row.requested_memory_bytes),
                ("requested", "cpu_millis", row.requested_cpu_millis),
                ("granted", "memory_bytes", row.granted_memory_bytes),
                ("granted", "cpu_millis", row.granted_cpu_millis),
                ("measured", "memory_bytes", row.measured.memory_bytes),
                ("measured", "memory_peak_bytes", row.measured.memory_peak_bytes),
                ("measured", "cpu_millis", row.measured.cpu_millis),
                ("measured", "cpu_time_seconds", row.measured.cpu_time_micros / 1e6),
            ):
                family.add_metric([row.ecm, kind, dimension], value)
        yield family
