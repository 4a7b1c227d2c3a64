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
import time
from collections.abc import Iterable
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rm_server.domain.engineconn import EcmUsage

log = logging.getLogger(__name__)


class UsageSource(Protocol):
    async def usage_by_ecm(self, limit: int) -> list[EcmUsage]: ...


class EngineConnUsageCollector(Collector):
    """See the module docstring."""

    def __init__(self, source: UsageSource, cap: int, cache_seconds: float) -> None:
        self.source = source
        self.cap = max(0, cap)
        self.cache_seconds = cache_seconds
        self._rows: list[EcmUsage] = []
        self._taken = float("-inf")

    async def refresh(self) -> None:
        if time.monotonic() - self._taken < self.cache_seconds:
            return
        try:
            self._rows = await self.source.usage_by_ecm(self.cap)
        except Exception:  # a scrape must still answer while the database is down
            log.warning("reading EngineConn usage for metrics failed", exc_info=True)
        self._taken = time.monotonic()

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "labelrm_engine_conn_resource",
            "Over an ECM's live EngineConns: requested, granted (what their agent enforces)"
            " and measured (from their cgroups) resource, by dimension.",
            labels=["ecm", "kind", "dimension"],
        )
        for row in self._rows:
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
