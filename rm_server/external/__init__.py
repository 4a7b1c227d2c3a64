"""Adapters to the systems that hold external resources (Apache Linkis'
ExternalResourceService talks to them through one requester per provider).

An adapter fetches a provider's live figures and knows nothing of labelrm's database:
the use case (rm_server/app/providers.py) keeps the provider table, picks the requester
of each provider (REQUESTERS) and turns a failed fetch into the RM's refusal. Only the
YARN requester exists today (rm_server/external/yarn.py); another provider type (a
Kubernetes ResourceQuota, say) adds a ProviderType and a parser in
rm_server/domain/external.py, and a requester here with the `Requester` shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rm_server.clock import Clock
from rm_server.domain.external import ProviderConfig, ProviderType, SchedulerSnapshot
from rm_server.external.errors import FetchFailed, RMAuthRejected, RMUnreachable
from rm_server.external.secrets import SecretSource
from rm_server.external.yarn import YarnRequester

__all__ = ["REQUESTERS", "FetchFailed", "RMAuthRejected", "RMUnreachable", "Requester"]


class Requester(Protocol):
    """What the use case needs of a provider's requester: its live scheduler snapshot
    (cached for the provider's TTL), the last good one, and how many fetches it made.
    A failed fetch raises FetchFailed, or the domain's MalformedResponse /
    UnsupportedScheduler for a document it cannot read."""

    config: ProviderConfig
    fetches: int

    @property
    def last_good(self) -> SchedulerSnapshot | None: ...

    async def snapshot(self, *, fresh: bool = False) -> SchedulerSnapshot: ...

    async def close(self) -> None: ...


REQUESTERS: dict[ProviderType, Callable[[ProviderConfig, Clock, SecretSource], Requester]] = {
    ProviderType.YARN: YarnRequester,
}
"""One requester class per provider type."""
