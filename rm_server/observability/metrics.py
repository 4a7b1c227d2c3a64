"""Prometheus metrics of one RM process (the HTTP endpoint that serves them:
rm_server/observability/endpoint.py).

Every RM gets its own `CollectorRegistry` (so several in-process RMs in a test do not
share counters). What is exported:

- ``labelrm_rpc_duration_seconds{method,code}`` histogram and ``labelrm_rpc_total{method,
  code}`` counter, recorded for every call of every service (`RpcMetrics`, used by the
  server's interceptor, rm_server/service/interceptor.py);
- ``labelrm_apply_total{outcome}``: Apply outcomes, ``granted`` or the lower-cased
  ErrorInfo reason of the refusal (``insufficient_resource``, ``queued_behind_waiters``,
  ``wait_timeout``, ``invalid_argument``, ...), the lower-cased status code when the
  error carries no reason (``cancelled``, ``deadline_exceeded``, ...);
- ``labelrm_apply_waiting``: Apply calls in flight on this process that may wait
  (``wait_timeout`` > 0);
- ``labelrm_lock_expiry_reclaims_total``: LOCKED tickets this process reclaimed;
- per label record, read from the database at scrape time by `LabelResourceCollector`
  (see there for the cap on their number);
- per external provider and YARN queue, its last fetched figures (`ExternalQueueCollector`);
- ECMs and EngineConns by state, and the liveness judge's state (``labelrm_liveness_*``:
  a suspected disruption, the heard-since mark), read at scrape time;
- per ECM, the requested, granted and measured resource of its live EngineConns
  (`EngineConnUsageCollector`, rm_server/observability/usage.py);
- ``labelrm_usage_granted_resource_seconds_total{user,engine_type,dimension}``,
  ``labelrm_usage_measured_memory_byte_seconds_total{user,engine_type}`` and
  ``labelrm_usage_measured_cpu_seconds_total{user,engine_type}``: what this process
  rolled up into the usage ledger (each ended ticket is rolled up by one replica once:
  sum over the replicas); at most `label_cap` (user, engine type) pairs, the rest
  under ``user="_other", engine_type="_other"``; ``special.*`` dimensions as
  ``special``;
- the standard ``process_*``, ``python_*`` collectors.

Label values are bounded: methods are the registered ones, codes and reasons come from
the server's own code, and label records are capped; no ticket or EngineConn ids.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from rm_server.domain.model import LabelResource
from rm_server.domain.resources import SPECIAL_PREFIX
from rm_server.domain.usage import US_PER_SECOND, Ledger
from rm_server.observability.fleet import (
    LivenessCollector,
    LivenessSource,
    StateCountCollector,
    StateSource,
)
from rm_server.observability.usage import EngineConnUsageCollector, UsageSource

log = logging.getLogger(__name__)


class FleetSource(StateSource, UsageSource, Protocol):
    """What the fleet's collectors read: state counts and the EngineConns' usage."""


APPLY_METHOD = "labelrm.v1.ResourceManagerService/Apply"
OTHER_SERIES = ("_other", "_other")  # usage past the label cap
DEFAULT_LABEL_CAP = 1000
DEFAULT_CACHE_SECONDS = 2.0
# Waiting Applies can last minutes: the buckets reach past the usual wait timeouts.
PASS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
)  # fmt: skip
RPC_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip
_REASON_RE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


class LabelSource(Protocol):
    """What the collector needs of the core (RMCore's `capacity` satisfies it)."""

    async def list_label_resources(
        self, after: str, limit: int, source: str
    ) -> list[LabelResource]: ...


class Metrics:
    """The metric objects of one RM process."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        label_cap: int = DEFAULT_LABEL_CAP,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.label_cap = label_cap
        self.cache_seconds = cache_seconds
        self.labels: LabelResourceCollector | None = None
        self.states: StateCountCollector | None = None
        self.liveness: LivenessCollector | None = None
        self.usage: EngineConnUsageCollector | None = None
        r = self.registry
        self.rpc_duration = Histogram(
            "labelrm_rpc_duration_seconds",
            "Time the RM took to answer an RPC, by method and status code.",
            ["method", "code"],
            buckets=RPC_BUCKETS,
            registry=r,
        )
        # A stream is one RPC to the two above, however many beats it carried.
        self.message_duration = Histogram(
            "labelrm_stream_message_duration_seconds",
            "Time the RM took to answer one message of a call whose client streams its"
            " requests, one answer each (a heartbeat on HeartbeatStream), by method.",
            ["method"],
            buckets=RPC_BUCKETS,
            registry=r,
        )
        self.rpc_total = Counter(
            "labelrm_rpc",
            "RPCs answered, by method and status code.",
            ["method", "code"],
            registry=r,
        )
        self.apply_total = Counter(
            "labelrm_apply",
            "Apply outcomes: granted, or the lower-cased reason of the refusal.",
            ["outcome"],
            registry=r,
        )
        self.apply_waiting = Gauge(
            "labelrm_apply_waiting",
            "Apply calls in flight on this process that carry a wait_timeout.",
            registry=r,
        )
        self.background_pass = Histogram(
            "labelrm_background_pass_seconds",
            "Time one pass of a background job took on this process (ticket-sweep,"
            " liveness, demand-planner), by job: a pass that grows with the cluster shows here.",
            ["job"],
            buckets=PASS_BUCKETS,
            registry=r,
        )
        self._passes: dict[str, Histogram] = {}  # background_pass by job, resolved once
        self.reclaims = Counter(
            "labelrm_lock_expiry_reclaims",
            "LOCKED tickets reclaimed by this process because their lock timed out.",
            registry=r,
        )
        self.usage_granted = Counter(
            "labelrm_usage_granted_resource_seconds",
            "Resource-seconds granted (locked, then used) to ended tickets, by user, engine"
            " type and dimension (memory_bytes: byte-seconds, cpu_millis: millicore-seconds).",
            ["user", "engine_type", "dimension"],
            registry=r,
        )
        self.usage_memory = Counter(
            "labelrm_usage_measured_memory_byte_seconds",
            "Memory byte-seconds the agents measured ended EngineConns' tickets using.",
            ["user", "engine_type"],
            registry=r,
        )
        self.usage_cpu = Counter(
            "labelrm_usage_measured_cpu_seconds",
            "CPU-seconds the agents measured ended EngineConns' tickets using.",
            ["user", "engine_type"],
            registry=r,
        )
        self._usage_series: set[tuple[str, str]] = set()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._peers: list[Callable[[], Awaitable[bytes]]] = []

    def for_method(self, method: str) -> RpcMetrics:
        """What records the calls of `method` ("labelrm.v1.ResourceManagerService/Apply")."""
        return RpcMetrics(self, method)

    def attach(self, labels: LabelSource) -> None:
        """Export the label records `labels` reads."""
        self.labels = LabelResourceCollector(labels, self.label_cap, self.cache_seconds)
        self.registry.register(self.labels)

    def count_reclaims(self, count: int) -> None:
        """`count` LOCKED tickets were reclaimed (the sweep's `on_reclaimed` hook)."""
        self.reclaims.inc(count)

    def count_usage(self, ledger: Ledger) -> None:
        """What one roll-up added to the usage ledger (the core's `on_rolled` hook): the
        rows counting each ticket once, into the counters of resource-seconds."""
        for key, amounts in ledger.items():
            if key.label:
                continue
            user, engine = self._usage_pair(key.user, key.engine_type)
            for dim, amount in amounts.granted.items():
                dimension = "special" if dim.startswith(SPECIAL_PREFIX) else dim
                self.usage_granted.labels(user, engine, dimension).inc(amount / US_PER_SECOND)
            if amounts.measured_memory:
                self.usage_memory.labels(user, engine).inc(amounts.measured_memory / US_PER_SECOND)
            if amounts.measured_cpu:
                self.usage_cpu.labels(user, engine).inc(amounts.measured_cpu / US_PER_SECOND)

    def _usage_pair(self, user: str, engine_type: str) -> tuple[str, str]:
        """The labels of a (user, engine type) pair: itself while under the cap."""
        pair = (user, engine_type)
        if pair in self._usage_series:
            return pair
        if len(self._usage_series) >= self.label_cap:
            return OTHER_SERIES
        self._usage_series.add(pair)
        return pair

    def observe_pass(self, job: str, seconds: float) -> None:
        """One pass of background job `job` took `seconds` (the periodic loop's `observe`
        hook, app/background.py)."""
        histogram = self._passes.get(job)
        if histogram is None:
            histogram = self._passes[job] = self.background_pass.labels(job)
        histogram.observe(seconds)

    def attach_external(self, source: Any) -> None:
        """Export the YARN queues labelrm admits against (`ExternalResources`)."""
        self.registry.register(ExternalQueueCollector(source))

    def attach_console(self, source: ViewCounts) -> None:
        """Export how often the web console computed and answered each view."""
        self.registry.register(ConsoleCollector(source))

    def attach_states(self, source: FleetSource) -> None:
        """Export ECMs and EngineConns by state, and the EngineConns' requested, granted
        and measured resource per ECM (rm_server/observability/usage.py)."""
        self.states = StateCountCollector(source, self.cache_seconds)
        self.registry.register(self.states)
        self.usage = EngineConnUsageCollector(source, self.label_cap, self.cache_seconds)
        self.registry.register(self.usage)

    def attach_liveness(self, source: LivenessSource) -> None:
        """Export the liveness judge's state."""
        self.liveness = LivenessCollector(source, self.cache_seconds)
        self.registry.register(self.liveness)

    def add_peer(self, fetch: Callable[[], Awaitable[bytes]]) -> None:
        """Fold the exposition `fetch` returns (the agents' process's, rm_server.
        agent_process) into this one's, each of its samples labelled
        ``process="agents"``: one scrape shows both processes of one RM."""
        self._peers.append(fetch)

    async def exposition(self) -> bytes:
        """The text exposition, with the label records refreshed when stale, and the
        peers' samples folded in."""
        if self.labels is not None:
            await self.labels.refresh()
        if self.states is not None:
            await self.states.refresh()
        if self.liveness is not None:
            await self.liveness.refresh()
        if self.usage is not None:
            await self.usage.refresh()
        if not self._peers:
            return generate_latest(self.registry)
        families = {family.name: family for family in self.registry.collect()}
        for fetch in self._peers:
            text = (await fetch()).decode(errors="replace")
            for family in text_string_to_metric_families(text):
                samples = [
                    s._replace(labels={**s.labels, "process": "agents"}) for s in family.samples
                ]
                mine = families.get(family.name)
                if mine is not None and mine.type == family.type:
                    mine.samples.extend(samples)
                elif mine is None:
                    family.samples = samples
                    families[family.name] = family
        return generate_latest(_Families(list(families.values())))


class _Families:
    """Metric families as a collector (what generate_latest reads)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class RpcMetrics:
    """The metrics of one method's calls, with their labelled children resolved once per
    status code (``labels()`` takes a lock and builds a key on every use)."""

    def __init__(self, metrics: Metrics, method: str) -> None:
        self.metrics = metrics
        self.method = method
        self.is_apply = method == APPLY_METHOD
        self._by_code: dict[str, tuple[Histogram, Counter]] = {}
        self._by_outcome: dict[str, Counter] = {}
        self._message: Histogram | None = None

    def begin(self, request: Any) -> bool:
        """At the start of a call: True for an Apply that may wait, which counts in
        ``labelrm_apply_waiting`` until `end`."""
        if self.is_apply and _waits(request):
            self.metrics.apply_waiting.inc()
            return True
        return False

    def message(self, seconds: float) -> None:
        """One message of a streamed call answered, `seconds` after it arrived."""
        if self._message is None:
            self._message = self.metrics.message_duration.labels(self.method)
        self._message.observe(seconds)

    def end(self, waiting: bool, code: str, reason: str, seconds: float) -> None:
        """At the end of a call: its duration and status (and for Apply, its outcome)."""
        if waiting:
            self.metrics.apply_waiting.dec()
        children = self._by_code.get(code)
        if children is None:
            m = self.metrics
            children = (
                m.rpc_duration.labels(self.method, code),
                m.rpc_total.labels(self.method, code),
            )
            self._by_code[code] = children
        children[0].observe(seconds)
        children[1].inc()
        if self.is_apply:
            outcome = apply_outcome(code, reason)
            counter = self._by_outcome.get(outcome)
            if counter is None:
                counter = self._by_outcome[outcome] = self.metrics.apply_total.labels(outcome)
            counter.inc()


def apply_outcome(code: str, reason: str) -> str:
    """``granted``, or the refusal's reason (its code without one), lower-cased."""
    if code == "OK":
        return "granted"
    if reason and _REASON_RE.fullmatch(reason):
        return reason.lower()
    return code.lower()


def _waits(request: Any) -> bool:
    wait = getattr(request, "wait_timeout", None)
    return wait is not None and (wait.seconds > 0 or wait.nanos > 0)


@dataclass(frozen=True)
class _Snapshot:
    records: tuple[LabelResource, ...]
    truncated: bool
    ok: bool
    seconds: float


class LabelResourceCollector(Collector):
    """Per label record: used, locked, max and left per dimension, and live tickets.

    Read through the core at scrape time and cached for `cache_seconds`, so several
    scrapers (or a fast one) cost one database read per interval. At most `cap` records
    are exported, in label order; ``labelrm_label_records_truncated`` is 1 when there
    were more. Samples are ``{label, source, dimension}``, where the dimension carries
    the unit (``memory_bytes``, ``cpu_millis``, ``instances``, ``yarn.*``, ``special.*``).
    """

    PAGE = 500

    def __init__(self, core: LabelSource, cap: int, cache_seconds: float) -> None:
        self.core = core
        self.cap = max(0, cap)
        self.cache_seconds = cache_seconds
        self._snapshot = _Snapshot((), False, True, 0.0)
        self._taken = float("-inf")
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Re-read the label records unless the cached ones are recent enough."""
        async with self._lock:
            if time.monotonic() - self._taken < self.cache_seconds:
                return
            start = time.perf_counter()
            try:
                records, truncated = await self._read()
                ok = True
            except Exception:  # a scrape must still answer while the database is down
                log.warning("reading label records for metrics failed", exc_info=True)
                records, truncated, ok = [], False, False
            self._snapshot = _Snapshot(tuple(records), truncated, ok, time.perf_counter() - start)
            self._taken = time.monotonic()

    async def _read(self) -> tuple[list[LabelResource], bool]:
        out: list[LabelResource] = []
        after = ""
        while len(out) <= self.cap:
            page = await self.core.list_label_resources(after, self.PAGE, "")
            out.extend(page)
            if len(page) < self.PAGE:
                break
            after = page[-1].label
        return out[: self.cap], len(out) > self.cap

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot
        names = ("label", "source", "dimension")
        used = GaugeMetricFamily("labelrm_label_used", "Used resource of a label.", labels=names)
        locked = GaugeMetricFamily(
            "labelrm_label_locked", "Locked (applied, not yet reported) resource.", labels=names
        )
        maximum = GaugeMetricFamily(
            "labelrm_label_max", "Maximum resource of an ECM or limit label.", labels=names
        )
        reserved = GaugeMetricFamily(
            "labelrm_label_reserved",
            "Resource reserved for demands in their window (counted as in use).",
            labels=names,
        )
        left = GaugeMetricFamily(
            "labelrm_label_left",
            "What is left: max - used - locked - protected - reserved, clamped at 0.",
            labels=names,
        )
        tickets = GaugeMetricFamily(
            "labelrm_label_live_tickets", "Live tickets charged to a label.", labels=names[:2]
        )
        records = GaugeMetricFamily(
            "labelrm_label_records", "Label records exported, by source.", labels=["source"]
        )
        per_source: dict[str, int] = {}
        for r in snap.records:
            source = r.source or "-"
            per_source[source] = per_source.get(source, 0) + 1
            for family, held in ((used, r.used), (locked, r.locked), (reserved, r.reserved)):
                for dim, qty in held.quantities if held is not None else ():
                    family.add_metric([r.label, source, dim], qty)
            if r.max_resource is not None:
                for dim, qty in r.max_resource.quantities:
                    maximum.add_metric([r.label, source, dim], qty)
                rest = r.left()  # None for incompatible kinds: `check` reports those
                for dim, qty in rest.quantities if rest is not None else ():
                    left.add_metric([r.label, source, dim], qty)
            tickets.add_metric([r.label, source], r.live_tickets)
        for source, count in sorted(per_source.items()):
            records.add_metric([source], count)
        yield from (used, locked, reserved, maximum, left, tickets, records)
        yield GaugeMetricFamily(
            "labelrm_label_records_truncated",
            "1 when more label records exist than the metrics cap exports.",
            value=1 if snap.truncated else 0,
        )
        yield GaugeMetricFamily(
            "labelrm_label_scrape_success",
            "1 when the last read of the label records succeeded.",
            value=1 if snap.ok else 0,
        )
        yield GaugeMetricFamily(
            "labelrm_label_scrape_duration_seconds",
            "Time the last read of the label records took.",
            value=snap.seconds,
        )


class ExternalQueueCollector(Collector):
    """Per provider and queue, the YARN figures of the provider's last successful fetch
    (scrapes never ask YARN themselves): ``labelrm_external_queue_max`` / ``_used``
    {provider, queue, dimension}, ``labelrm_external_queue_apps`` {provider, queue, state},
    and per provider ``labelrm_external_last_fetch_timestamp_seconds`` and
    ``labelrm_external_fetches_total``. labelrm's in-flight part is the queue record's
    ``labelrm_label_locked`` (source ``external``)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        names = ("provider", "queue", "dimension")
        maximum = GaugeMetricFamily(
            "labelrm_external_queue_max",
            "A YARN queue's maximum, as YARN reports it.",
            labels=names,
        )
        used = GaugeMetricFamily(
            "labelrm_external_queue_used", "What YARN reports in use on a queue.", labels=names
        )
        apps = GaugeMetricFamily(
            "labelrm_external_queue_apps",
            "Applications on a YARN queue, running or pending.",
            labels=("provider", "queue", "state"),
        )
        fetched = GaugeMetricFamily(
            "labelrm_external_last_fetch_timestamp_seconds",
            "When the provider's figures were last fetched successfully.",
            labels=("provider",),
        )
        fetches = CounterMetricFamily(
            "labelrm_external_fetches",
            "Scheduler documents fetched from the provider by this process.",
            labels=("provider",),
        )
        for name, snap, count in self.source.fetch_states():
            fetches.add_metric([name], count)
            if snap is None:
                continue
            if snap.fetched_at is not None:
                fetched.add_metric([name], snap.fetched_at.timestamp())
            for path, q in sorted(snap.queues.items()):
                for dim, qty in q.maximum.quantities:
                    maximum.add_metric([name, path, dim], qty)
                for dim, qty in q.used.quantities:
                    used.add_metric([name, path, dim], qty)
                apps.add_metric([name, path, "running"], q.apps_running)
                apps.add_metric([name, path, "pending"], q.apps_pending)
        yield from (maximum, used, apps, fetched, fetches)


class ViewCounts(Protocol):
    """Per view of the web console, its computations and its answers (console/cache.py)."""

    @property
    def builds(self) -> Mapping[str, int]: ...

    @property
    def reads(self) -> Mapping[str, int]: ...


class ConsoleCollector(Collector):
    """``labelrm_console_view_builds_total{view}`` (computations) and
    ``labelrm_console_view_reads_total{view}`` (answers): the first grows with the views
    looked at and the refresh period, not with the browsers open; their ratio is how many
    answers each computation served. Views are a fixed set of names."""

    def __init__(self, source: ViewCounts) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        for name, counts, help_text in (
            ("labelrm_console_view_builds", self.source.builds,
             "Web console views computed (from the database), by view."),
            ("labelrm_console_view_reads", self.source.reads,
             "Web console views answered (computed or kept), by view."),
        ):  # fmt: skip
            family = CounterMetricFamily(name, help_text, labels=["view"])
            for view, count in sorted(counts.items()):
                family.add_metric([view], count)
            yield family
