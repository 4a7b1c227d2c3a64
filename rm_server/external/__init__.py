"""External resources (Apache Linkis' ExternalResourceService): providers from the store,
one requester per provider, and the queue figures an Apply is admitted against.

Only the YARN requester exists today (rm_server/external/yarn.py); another provider type (a
Kubernetes ResourceQuota, say) adds a ProviderType, a requester with the same ``snapshot()``
shape, and a parser in rm_server/domain/external.py.

A failed fetch is told to users by its cluster only (``YARN of cluster=prod is
unavailable``): users may not list providers, and the addresses, ports and errors of
the system behind them are the operator's (the requester logs them, one line per failed
fetch, and `rmctl provider test` shows them to admins).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from rm_server.clock import Clock
from rm_server.domain.external import (
    QUEUE_KEY,
    MalformedResponse,
    ProviderConfig,
    ProviderType,
    QueueCheck,
    QueueView,
    SchedulerSnapshot,
    UnknownQueue,
    UnsupportedScheduler,
    cluster_of,
    in_flight_of,
    parse_queue_label,
    queue_label,
    yarn_part,
)
from rm_server.domain.labels import Label
from rm_server.domain.resources import Resource, ResourceKind
from rm_server.errors import (
    FailedPrecondition,
    InvalidArgument,
    LabelrmError,
    NotFound,
    Unavailable,
)
from rm_server.external.secrets import SecretMissing, SecretSource
from rm_server.external.yarn import RMAuthRejected, RMUnreachable, YarnRequester
from rm_server.store import providers as provider_store
from rm_server.store.db import Database, Idempotency, OutcomeEncoder, Replay


class Requester(Protocol):
    """What admission needs of a provider type's requester (YarnRequester is one)."""

    config: ProviderConfig
    fetches: int

    @property
    def last_good(self) -> SchedulerSnapshot | None: ...

    async def snapshot(self, *, fresh: bool = False) -> SchedulerSnapshot: ...

    async def close(self) -> None: ...


# One requester class per provider type: a new type (a Kubernetes ResourceQuota, say) adds
# its ProviderType, a requester here, and a parser into QueueFigures.
REQUESTERS: dict[ProviderType, Callable[[ProviderConfig, Clock, SecretSource], Requester]] = {
    ProviderType.YARN: YarnRequester,
}

log = logging.getLogger(__name__)

PROVIDERS_TTL = 2.0  # how long a replica trusts its copy of the provider table


class ExternalResources:
    """Providers, requesters and the live queue figures of every cluster label."""

    def __init__(self, db: Database, clock: Clock, secrets: SecretSource | None = None) -> None:
        self.db = db
        self.clock = clock
        self.secrets = secrets if secrets is not None else SecretSource()  # password_secret
        self._providers: dict[str, ProviderConfig] = {}  # by cluster
        self._providers_until = 0.0
        self._requesters: dict[str, Requester] = {}  # by provider name
        self._closing: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        for requester in self._requesters.values():
            await requester.close()
        self._requesters.clear()

    def fetch_states(self) -> list[tuple[str, SchedulerSnapshot | None, int]]:
        """Per provider in use: its name, last good snapshot and fetch count (metrics)."""
        return [(n, r.last_good, r.fetches) for n, r in sorted(self._requesters.items())]

    def invalidate(self) -> None:
        """Forget the cached provider table (after a change on this replica)."""
        self._providers_until = 0.0

    async def put_provider(
        self, idem: Idempotency, provider: ProviderConfig, encoder: OutcomeEncoder[ProviderConfig]
    ) -> ProviderConfig | Replay:
        """Create or replace a provider; this replica sees the change at once, others
        within PROVIDERS_TTL. A secret it names must be there (on this replica)."""
        if provider.password_secret:
            try:
                self.secrets.read(provider.password_secret)
            except SecretMissing as exc:
                raise FailedPrecondition(
                    f"provider.password_secret: {exc} (put the password in a file of"
                    " provider_secrets_dir or in that variable first)",
                    state="SECRET_MISSING",
                    reason="EXTERNAL_SECRET_MISSING",
                ) from None
        now = self.clock.now()
        try:
            return await self.db.run_idempotent(
                idem, now, lambda c: provider_store.put_provider(c, provider, now), encoder
            )
        finally:
            self.invalidate()

    async def delete_provider(
        self, idem: Idempotency, name: str, encoder: OutcomeEncoder[ProviderConfig]
    ) -> ProviderConfig | Replay:
        now = self.clock.now()
        try:
            return await self.db.run_idempotent(
                idem, now, lambda c: provider_store.delete_provider(c, name), encoder
            )
        finally:
            self.invalidate()

    async def list_providers(self) -> list[ProviderConfig]:
        return await self.db.run(provider_store.list_providers, read_only=True)

    async def test_provider(self, name: str) -> tuple[SchedulerSnapshot, list[QueueView]]:
        """Fetch the named provider's figures now (no cache) and list its queues; a failure
        says what the admin needs (addresses and errors)."""
        found = [p for p in await self.list_providers() if p.name == name]
        if not found:
            raise NotFound(f"provider {name} not found")
        return await self.queue_views(found[0])

    async def provider_for(self, cluster: str) -> ProviderConfig | None:
        if time.monotonic() >= self._providers_until:
            async with self._lock:
                if time.monotonic() >= self._providers_until:
                    listed = await self.db.run(provider_store.list_providers, read_only=True)
                    self._providers = {p.cluster: p for p in listed}
                    self._providers_until = time.monotonic() + PROVIDERS_TTL
        return self._providers.get(cluster)

    def requester(self, provider: ProviderConfig) -> Requester:
        """The provider's requester (a new one, with an empty cache, when its config changed)."""
        current = self._requesters.get(provider.name)
        if current is None or current.config != provider:
            if current is not None:  # replaced: close its connections in the background
                task = asyncio.get_running_loop().create_task(current.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            make = REQUESTERS[provider.type]
            current = self._requesters[provider.name] = make(provider, self.clock, self.secrets)
        return current

    async def snapshot(
        self, provider: ProviderConfig, *, fresh: bool = False, detailed: bool = False
    ) -> SchedulerSnapshot:
        """The provider's live scheduler snapshot; errors mapped to the RM's statuses. A
        failure names the cluster only (module doc), unless `detailed` (for admins): then
        the provider, its addresses and the error as well."""
        try:
            return await self.requester(provider).snapshot(fresh=fresh)
        except (RMUnreachable, RMAuthRejected, MalformedResponse, UnsupportedScheduler) as exc:
            raise _refusal(provider, exc, detailed) from None

    async def admission(
        self, labels: tuple[Label, ...], resource: Resource, field: str = "resource"
    ) -> tuple[QueueCheck, Resource] | None:
        """The queue an Apply must also fit, and the request with the queue's full path;
        None when the request has no YARN part or no cluster label (nothing external)."""
        part = yarn_part(resource)
        cluster = cluster_of(labels)
        if part is None or cluster is None:
            return None
        provider = await self.provider_for(cluster)
        if provider is None:
            raise FailedPrecondition(
                f"no external resource provider serves cluster={cluster}",
                state="NO_PROVIDER",
                reason="EXTERNAL_NO_PROVIDER",
            )
        named = next((lb.value for lb in labels if lb.key == QUEUE_KEY), "")
        queue_field = f"{field}.{_yarn_field(resource)}.queue_name"
        if named and part.queue and named != part.queue:
            raise InvalidArgument(
                queue_field, f"queue {part.queue!r} differs from label {QUEUE_KEY}={named}"
            )
        name = part.queue or named
        if not name:
            raise InvalidArgument(
                queue_field, f"a yarn request on cluster={cluster} must name its queue"
            )
        snap = await self.snapshot(provider)
        try:
            figures = snap.resolve(name)
        except UnknownQueue as exc:
            raise NotFound(f"cluster={cluster}: {exc}", reason="EXTERNAL_UNKNOWN_QUEUE") from None
        if not figures.leaf:
            raise InvalidArgument(
                queue_field,
                f"{figures.path} is a parent queue; YARN runs applications in leaf queues only",
            )
        label = queue_label(cluster, figures.path)
        canonical = _with_queue(resource, figures.path)
        return QueueCheck(label, figures, snap.fetched_at), canonical

    async def label_view(
        self, label: str, locked: Resource
    ) -> tuple[QueueView, SchedulerSnapshot, str] | None:
        """The queue view of an external label record: YARN's figures (the cached ones, or
        the last good ones with the error of the failed fetch), labelrm's in flight."""
        parsed = parse_queue_label(label)
        if parsed is None:
            return None
        cluster, path = parsed
        provider = await self.provider_for(cluster)
        if provider is None:
            return None
        requester = self.requester(provider)
        error = ""
        try:
            snap = await self.snapshot(provider)
        except LabelrmError as exc:
            if requester.last_good is None:
                return None
            snap, error = requester.last_good, exc.message
        figures = snap.queues.get(path)
        if figures is None:
            return None
        return QueueView(label, figures, in_flight_of(locked)), snap, error

    def recheck_after(self, check: QueueCheck) -> float:
        """How long a waiting apply may sleep before the queue's figures are due again."""
        for requester in self._requesters.values():
            if check.label.startswith(f"cluster={requester.config.cluster},"):
                return max(requester.config.cache_ttl_seconds, 0.1)
        return 1.0

    async def queue_views(
        self, provider: ProviderConfig
    ) -> tuple[SchedulerSnapshot, list[QueueView]]:
        """Every queue of a provider with labelrm's in-flight part (for `provider test` and
        the queue views)."""
        snap = await self.snapshot(provider, fresh=True, detailed=True)
        locked = await self.db.run(
            lambda c: provider_store.queue_rows_locked(c, f"cluster={provider.cluster},"),
            read_only=True,
        )
        views = []
        for path, figures in sorted(snap.queues.items()):
            label = queue_label(provider.cluster, path)
            in_flight = in_flight_of(locked.get(label, Resource.yarn("", 0, 0, 0)))
            views.append(QueueView(label, figures, in_flight))
        return snap, views


def _refusal(provider: ProviderConfig, exc: Exception, detailed: bool) -> LabelrmError:
    """The error a failed fetch of `provider` ends a call with: for users, what happened
    to the cluster they named; `detailed`, the provider and the error (addresses)."""
    where = f"YARN of cluster={provider.cluster}"
    detail = f" (provider {provider.name}: {exc})" if detailed else " (details in the RM's log)"
    if isinstance(exc, RMAuthRejected):
        return FailedPrecondition(
            f"{where} refused labelrm's credentials, or labelrm has none for it{detail}",
            state="AUTH_REJECTED",
            reason="EXTERNAL_AUTH",
        )
    if isinstance(exc, MalformedResponse):
        return Unavailable(
            f"{where} answered a document labelrm cannot read{detail}",
            reason="EXTERNAL_MALFORMED",
        )
    if isinstance(exc, UnsupportedScheduler):  # no address in it: the scheduler's type
        return FailedPrecondition(
            f"{where}: {exc}", state="UNSUPPORTED_SCHEDULER", reason="EXTERNAL_UNSUPPORTED"
        )
    return Unavailable(
        f"{where} is unavailable: no ResourceManager answered{detail}",
        reason="EXTERNAL_UNAVAILABLE",
    )


def _yarn_field(resource: Resource) -> str:
    return "yarn" if resource.kind is ResourceKind.YARN else "driver_and_yarn.yarn"


def _with_queue(resource: Resource, path: str) -> Resource:
    if resource.queue == path:
        return resource
    return Resource(resource.kind, resource.quantities, path)
