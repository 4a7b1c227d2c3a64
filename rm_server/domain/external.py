"""External resources: providers, YARN scheduler figures, and queue admission (pure, no I/O).

A provider names a cluster label (``cluster=prod``) and how to reach the system that owns the
resource (for YARN: the ResourceManager web addresses of an HA pair). The YARN requester
(rm_server/external/yarn.py) fetches ``/ws/v1/cluster/scheduler`` (and, for the capacity
scheduler, ``/ws/v1/cluster/metrics``); :func:`parse_scheduler` turns those documents, as
Hadoop's ResourceManager REST API documentation describes them, into :class:`QueueFigures`
for every queue at any depth, in labelrm's units (bytes, milli-cores, applications).

A YARN request is admitted against a queue when it fits
``YARN max - YARN used - labelrm in flight``, where "in flight" is what labelrm has granted
on that queue and YARN cannot show yet (tickets still LOCKED on the queue's label row).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rm_server.domain.errors import DomainError
from rm_server.domain.labels import Label, LabelKey
from rm_server.domain.model import Refusal
from rm_server.domain.resources import (
    MAX_QUANTITY,
    YARN_CPU,
    YARN_INSTANCES,
    YARN_MEMORY,
    Resource,
    ResourceKind,
    Shortfall,
)

MIB = 1024 * 1024
CLUSTER_KEY = "cluster"
QUEUE_KEY = "yarnQueue"
# The fair scheduler's own "no limit" on applications (Integer.MAX_VALUE).
UNLIMITED_APPS = 2**31 - 1

_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")
# A secret's name: the file of that name in provider_secrets_dir, or the environment
# variable LABELRM_PROVIDER_SECRET_<NAME> (rm_server/external/secrets.py): no path in it.
SECRET_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_ADDRESS_RE = re.compile(r"https?://[A-Za-z0-9_.:\[\]-]+(/[A-Za-z0-9_./-]*)?")
_QUEUE_PATH_RE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


class ExternalError(DomainError):
    """Base class of the external-resource domain errors."""


class ProviderConfigError(ExternalError):
    """A provider definition is invalid; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field)


class MalformedResponse(ExternalError):
    """The external system answered with a document labelrm cannot read."""


class UnsupportedScheduler(ExternalError):
    """The YARN scheduler is neither the capacity nor the fair scheduler."""


class UnknownQueue(ExternalError):
    """No queue of that name (or the name is ambiguous) in the scheduler's tree."""


class ProviderType(enum.StrEnum):
    """Kinds of external resource provider; each has a requester (rm_server/external)."""

    YARN = "yarn"


class AuthKind(enum.StrEnum):
    NONE = "none"
    BASIC = "basic"


@dataclass(frozen=True)
class ProviderConfig:
    """One external resource provider, as stored (migration 0009) and managed by admins."""

    name: str
    type: ProviderType
    cluster: str  # the value of the cluster label it serves: requests with cluster=<this>
    addresses: tuple[str, ...]  # RM web addresses, e.g. http://rm1:8088 (HA: several)
    auth: AuthKind = AuthKind.NONE
    username: str = ""
    password: str = ""  # never returned by list calls (see redacted())
    timeout_seconds: float = 5.0
    cache_ttl_seconds: float = 2.0
    # Capacity scheduler: a queue's maximum is absoluteMaxCapacity (what YARN lets it grow
    # to) unless `capacity_guaranteed` asks for absoluteCapacity (its guaranteed share).
    capacity_guaranteed: bool = False
    # Instead of `password`: the name of a secret the RM reads it from at each fetch (a
    # file, an environment variable); then no password is stored.
    password_secret: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ProviderConfigError("name", "must match [a-z][a-z0-9-]{0,62}")
        try:
            object.__setattr__(self, "type", ProviderType(self.type))
        except ValueError:
            raise ProviderConfigError("type", f"unknown provider type {self.type!r}") from None
        try:
            Label(CLUSTER_KEY, self.cluster)
        except ValueError as exc:
            raise ProviderConfigError("cluster", str(exc)) from None
        if not self.addresses:
            raise ProviderConfigError("addresses", "at least one RM web address is required")
        for i, address in enumerate(self.addresses):
            if not isinstance(address, str) or not _ADDRESS_RE.fullmatch(address):
                raise ProviderConfigError(
                    f"addresses[{i}]", f"{address!r} is not an http(s)://host:port address"
                )
        if len(set(self.addresses)) != len(self.addresses):
            raise ProviderConfigError("addresses", "duplicate address")
        try:
            object.__setattr__(self, "auth", AuthKind(self.auth))
        except ValueError:
            raise ProviderConfigError("auth", f"unknown auth {self.auth!r}") from None
        if self.auth is AuthKind.BASIC and not self.username:
            raise ProviderConfigError("username", "basic auth needs a user name")
        if self.auth is AuthKind.NONE and (self.username or self.password or self.password_secret):
            raise ProviderConfigError("auth", "a user name or password needs auth=basic")
        if self.password_secret:
            if not SECRET_NAME_RE.fullmatch(self.password_secret):
                raise ProviderConfigError(
                    "password_secret", "a secret's name must match [a-z][a-z0-9_-]{0,62}"
                )
            if self.password:
                raise ProviderConfigError(
                    "password_secret", "give a password or the name of a secret, not both"
                )
        if not 0 < self.timeout_seconds <= 60 or math.isnan(self.timeout_seconds):
            raise ProviderConfigError("timeout_seconds", "must be in (0, 60]")
        if not 0 <= self.cache_ttl_seconds <= 300 or math.isnan(self.cache_ttl_seconds):
            raise ProviderConfigError("cache_ttl_seconds", "must be in [0, 300]")

    @property
    def cluster_label(self) -> Label:
        return Label(CLUSTER_KEY, self.cluster)

    def redacted(self) -> ProviderConfig:
        """The provider without its secret (what list calls return)."""
        return ProviderConfig(
            self.name,
            self.type,
            self.cluster,
            self.addresses,
            self.auth,
            self.username,
            "",
            self.timeout_seconds,
            self.cache_ttl_seconds,
            self.capacity_guaranteed,
            self.password_secret,  # a name, not the secret
        )

    def to_config_json(self) -> dict[str, Any]:
        """The stored config document (everything but name, type and cluster)."""
        return {
            "addresses": list(self.addresses),
            "auth": self.auth.value,
            "username": self.username,
            "password": self.password,
            "timeout_seconds": self.timeout_seconds,
            "cache_ttl_seconds": self.cache_ttl_seconds,
            "capacity_guaranteed": self.capacity_guaranteed,
            "password_secret": self.password_secret,
        }

    @classmethod
    def from_stored(
        cls, name: str, type_: str, cluster: str, config: Mapping[str, Any]
    ) -> ProviderConfig:
        """The provider from its table row (name, type, cluster, config document)."""
        return cls(
            name=name,
            type=ProviderType(type_),
            cluster=cluster,
            addresses=tuple(config.get("addresses", ())),
            auth=AuthKind(config.get("auth", "none")),
            username=str(config.get("username", "")),
            password=str(config.get("password", "")),
            timeout_seconds=float(config.get("timeout_seconds", 5.0)),
            cache_ttl_seconds=float(config.get("cache_ttl_seconds", 2.0)),
            capacity_guaranteed=bool(config.get("capacity_guaranteed", False)),
            password_secret=str(config.get("password_secret", "")),
        )


def split_addresses(text: str) -> tuple[str, ...]:
    """``"http://rm1:8088;http://rm2:8088"`` (Linkis' ``rmWebAddress`` form) as a tuple."""
    return tuple(a.strip().rstrip("/") for a in text.split(";") if a.strip())


# ----- YARN scheduler documents -------------------------------------------------------------


class SchedulerKind(enum.StrEnum):
    CAPACITY = "capacity"
    FAIR = "fair"


@dataclass(frozen=True)
class QueueFigures:
    """One YARN queue's live figures in labelrm units (a YARN resource named by its path)."""

    path: str  # full path, e.g. root.a.a1
    scheduler: SchedulerKind
    maximum: Resource  # YARN kind
    used: Resource  # YARN kind
    apps_running: int
    apps_pending: int
    leaf: bool


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Every queue of one scheduler document, by full path, and when it was fetched."""

    scheduler: SchedulerKind
    queues: Mapping[str, QueueFigures]
    fetched_at: datetime | None = None
    active_address: str = ""
    cluster_memory_bytes: int = 0
    cluster_cpu_millis: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def resolve(self, name: str) -> QueueFigures:
        """The queue named by its full path (``root.a.a1``), its path without ``root.``
        (``a.a1``), or its own name when that is unique (``a1``: capacity leaf names are)."""
        if not isinstance(name, str) or not name or not _QUEUE_PATH_RE.fullmatch(name):
            raise UnknownQueue(f"invalid queue name {name!r}")
        for candidate in (name, f"root.{name}"):
            if candidate in self.queues:
                return self.queues[candidate]
        matches = [q for path, q in self.queues.items() if path.rsplit(".", 1)[-1] == name]
        if len(matches) == 1:
            return matches[0]
        if matches:
            paths = ", ".join(sorted(q.path for q in matches))
            raise UnknownQueue(f"queue name {name!r} is ambiguous: {paths}")
        raise UnknownQueue(f"no queue {name!r} in the {self.scheduler.value} scheduler")


def _obj(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise MalformedResponse(f"{what} is not a JSON object")
    return value


def _num(doc: Mapping[str, Any], key: str, what: str, default: float | None = None) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        if value is None:
            raise MalformedResponse(f"{what} has no {key}")
        raise MalformedResponse(f"{what}.{key} is not a number: {value!r}")
    if value < 0:
        raise MalformedResponse(f"{what}.{key} is negative: {value!r}")
    return float(value)


def _count(doc: Mapping[str, Any], key: str, what: str, default: int = 0) -> int:
    return _bounded(_num(doc, key, what, default))


def _bounded(value: float) -> int:
    return int(min(value, MAX_QUANTITY // 1000))


def _yarn(queue: str, memory_mb: float, vcores: float, apps: int) -> Resource:
    return Resource.yarn(queue, _bounded(memory_mb * MIB), _bounded(vcores * 1000), apps)


def _resource_obj(doc: Mapping[str, Any], key: str, what: str) -> tuple[float, float]:
    """(memory MB, vCores) of a documented resource object {memory, vCores}."""
    inner = _obj(doc.get(key), f"{what}.{key}")
    return _num(inner, "memory", f"{what}.{key}"), _num(inner, "vCores", f"{what}.{key}")


def _children(doc: Mapping[str, Any], key: str, what: str) -> list[Mapping[str, Any]]:
    """Sub-queues under ``key``: documented as ``{"queue": [...]}``; Jersey's JSON writer
    also gives a lone child as ``{"queue": {...}}`` and some versions a bare list."""
    value = doc.get(key)
    if value is None:
        return []
    if isinstance(value, Mapping):
        value = value.get("queue", [])
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        raise MalformedResponse(f"{what}.{key} is not a list of queues")
    return [_obj(v, f"{what}.{key}[{i}]") for i, v in enumerate(value)]


def parse_scheduler(
    scheduler_doc: object,
    metrics_doc: object | None = None,
    *,
    capacity_guaranteed: bool = False,
) -> SchedulerSnapshot:
    """Every queue of a ``/ws/v1/cluster/scheduler`` document.

    Capacity scheduler: a queue's maximum is ``absoluteMaxCapacity`` (or ``absoluteCapacity``
    with ``capacity_guaranteed``) percent of the cluster totals from ``/ws/v1/cluster/metrics``
    (``totalMB``, ``totalVirtualCores``); used is ``resourcesUsed``. Fair scheduler: maximum is
    ``maxResources``, used ``usedResources``. Memory MB -> bytes, vCores -> milli-cores.
    """
    info = _obj(
        _obj(_obj(scheduler_doc, "document").get("scheduler"), "scheduler").get("schedulerInfo"),
        "scheduler.schedulerInfo",
    )
    kind = info.get("type")
    if kind == "capacityScheduler":
        metrics = _obj(
            _obj(metrics_doc, "metrics document").get("clusterMetrics"), "clusterMetrics"
        )
        total_mb = _num(metrics, "totalMB", "clusterMetrics")
        total_vcores = _num(metrics, "totalVirtualCores", "clusterMetrics")
        queues = dict(_walk_capacity(info, "", total_mb, total_vcores, capacity_guaranteed))
        return SchedulerSnapshot(
            SchedulerKind.CAPACITY,
            queues,
            cluster_memory_bytes=_bounded(total_mb * MIB),
            cluster_cpu_millis=_bounded(total_vcores * 1000),
        )
    if kind == "fairScheduler":
        root = _obj(info.get("rootQueue"), "schedulerInfo.rootQueue")
        mem, vcores = _resource_obj(root, "clusterResources", "rootQueue")
        return SchedulerSnapshot(
            SchedulerKind.FAIR,
            dict(_walk_fair(root, "rootQueue")),
            cluster_memory_bytes=_bounded(mem * MIB),
            cluster_cpu_millis=_bounded(vcores * 1000),
        )
    raise UnsupportedScheduler(
        f"scheduler type {kind!r} is not supported (capacityScheduler or fairScheduler)"
    )


def _walk_capacity(
    doc: Mapping[str, Any], parent: str, total_mb: float, total_vcores: float, guaranteed: bool
) -> Iterator[tuple[str, QueueFigures]]:
    name = doc.get("queueName")
    if not isinstance(name, str) or not name:
        raise MalformedResponse(f"a queue under {parent or 'the scheduler'} has no queueName")
    path = name if not parent else f"{parent}.{name}"
    what = f"queue {path}"
    children = _children(doc, "queues", what)
    if parent:  # the root's own element carries no absolute figures
        share = _num(doc, "absoluteCapacity" if guaranteed else "absoluteMaxCapacity", what)
        share = min(share, 100.0)
        used_mb, used_vcores = _resource_obj(doc, "resourcesUsed", what)
        leaf = not children
        apps_max = _count(doc, "maxApplications", what, UNLIMITED_APPS) if leaf else UNLIMITED_APPS
        apps_total = _count(doc, "numApplications", what)
        running = _count(doc, "numActiveApplications", what, apps_total)
        pending = _count(doc, "numPendingApplications", what, max(apps_total - running, 0))
        yield (
            path,
            QueueFigures(
                path=path,
                scheduler=SchedulerKind.CAPACITY,
                maximum=_yarn(path, total_mb * share / 100, total_vcores * share / 100, apps_max),
                used=_yarn(path, used_mb, used_vcores, apps_total),
                apps_running=running,
                apps_pending=pending,
                leaf=leaf,
            ),
        )
    for child in children:
        yield from _walk_capacity(child, path, total_mb, total_vcores, guaranteed)


def _walk_fair(doc: Mapping[str, Any], what: str) -> Iterator[tuple[str, QueueFigures]]:
    path = doc.get("queueName")
    if not isinstance(path, str) or not path:
        raise MalformedResponse(f"a queue under {what} has no queueName")
    what = f"queue {path}"
    children = _children(doc, "childQueues", what)
    max_mb, max_vcores = _resource_obj(doc, "maxResources", what)
    used_mb, used_vcores = _resource_obj(doc, "usedResources", what)
    running = _count(doc, "numActiveApps", what)
    pending = _count(doc, "numPendingApps", what)
    yield (
        path,
        QueueFigures(
            path=path,
            scheduler=SchedulerKind.FAIR,
            maximum=_yarn(path, max_mb, max_vcores, _count(doc, "maxApps", what, UNLIMITED_APPS)),
            used=_yarn(path, used_mb, used_vcores, running + pending),
            apps_running=running,
            apps_pending=pending,
            leaf=not children,
        ),
    )
    for child in children:
        yield from _walk_fair(child, what)


def ha_state(info_doc: object) -> str:
    """``clusterInfo.haState`` of a ``/ws/v1/cluster/info`` document ("" when absent: an RM
    without HA reports none and is the active one)."""
    info = _obj(_obj(info_doc, "document").get("clusterInfo"), "clusterInfo")
    state = info.get("haState", "")
    if not isinstance(state, str):
        raise MalformedResponse("clusterInfo.haState is not a string")
    return state


# ----- queue labels and admission -----------------------------------------------------------


def queue_label(cluster: str, queue_path: str) -> str:
    """The resource-carrying label of a YARN queue: ``cluster=prod,yarnQueue=root.a.a1``."""
    return str(LabelKey((Label(CLUSTER_KEY, cluster), Label(QUEUE_KEY, queue_path))))


def parse_queue_label(label: str) -> tuple[str, str] | None:
    """(cluster, queue path) of a queue label made by :func:`queue_label`, else None."""
    try:
        key = LabelKey.parse(label)
    except ValueError:
        return None
    if key.keys() != (CLUSTER_KEY, QUEUE_KEY):
        return None
    return key.labels[0].value, key.labels[1].value


def cluster_of(labels: Sequence[Label]) -> str | None:
    """The value of the request's cluster label, if it has one."""
    return next((lb.value for lb in labels if lb.key == CLUSTER_KEY), None)


def yarn_part(resource: Resource) -> Resource | None:
    """The part of a request that a YARN queue must hold (None: the request has none)."""
    if resource.kind is ResourceKind.YARN:
        return resource
    if resource.kind is ResourceKind.DRIVER_AND_YARN:
        return resource.yarn_part()
    return None


_YARN_DIMS = (YARN_CPU, YARN_INSTANCES, YARN_MEMORY)


@dataclass(frozen=True)
class QueueView:
    """What labelrm knows of one queue at the moment of an admission decision or a query."""

    label: str
    figures: QueueFigures
    in_flight: Resource  # YARN kind: granted by labelrm, not yet visible in YARN's used

    @property
    def left(self) -> Resource:
        m, u, f = self.figures.maximum, self.figures.used, self.in_flight
        return Resource.yarn(
            m.queue,
            *(
                max(0, m.get(d) - u.get(d) - f.get(d))
                for d in (YARN_MEMORY, YARN_CPU, YARN_INSTANCES)
            ),
        )


def in_flight_of(locked: Resource) -> Resource:
    """The YARN part of a queue row's locked resource (the row may hold whole requests)."""
    part = yarn_part(locked)
    return Resource.yarn(locked.queue, 0, 0, 0) if part is None else part


def queue_shortfalls(view: QueueView, request: Resource) -> list[tuple[Shortfall, str]]:
    """Every YARN dimension the request does not fit, each with its breakdown
    (YARN max, YARN used, labelrm in flight). Empty when the request fits."""
    part = yarn_part(request)
    if part is None:
        return []
    left = view.left
    out: list[tuple[Shortfall, str]] = []
    for d in _YARN_DIMS:
        if part.get(d) > left.get(d):
            breakdown = (
                f"YARN max {view.figures.maximum.get(d)} - YARN used {view.figures.used.get(d)}"
                f" - labelrm in flight {view.in_flight.get(d)}"
            )
            out.append((Shortfall(view.label, d, part.get(d), left.get(d)), breakdown))
    return out


@dataclass(frozen=True)
class QueueCheck:
    """An Apply's external part: the queue's label record and YARN's live figures, checked
    inside the Apply's transaction against the record's locked (in-flight) resource."""

    label: str
    figures: QueueFigures
    fetched_at: datetime | None = None

    def refusal(self, locked: Resource, request: Resource) -> Refusal | None:
        """None when the request's YARN part fits the queue's live headroom minus labelrm's
        in-flight grants; else the shortfalls, with the breakdown of each as detail."""
        view = QueueView(self.label, self.figures, in_flight_of(locked))
        found = queue_shortfalls(view, request)
        if not found:
            return None
        detail = "; ".join(f"{s.dimension}: {breakdown}" for s, breakdown in found)
        return Refusal(
            tuple(s for s, _ in found), detail=f"yarn queue {self.figures.path}: {detail}"
        )
