"""The cluster figures: GetClusterInfo, ListEvents and the console's overview read the
database's own view of the cluster (its version, the replicas, the waiting applies, the
states objects went through) through here."""

from __future__ import annotations

from rm_server.app.shared import Shared
from rm_server.store import cluster as cluster_store
from rm_server.store import overview
from rm_server.store.cluster import EVENT_TABLES, ClusterRow, Event
from rm_server.store.overview import ClusterCounts

__all__ = ["EVENT_TABLES", "Cluster", "ClusterCounts", "ClusterRow", "Event"]


class Cluster:
    """Reads of the whole cluster, for operators and the console."""

    def __init__(self, core: Shared) -> None:
        self.core = core

    async def info(self) -> ClusterRow:
        """The database's version, the live replicas (oldest first, with the background
        leases each holds) and how many applies wait for capacity (each once)."""
        now = self.core.clock.now()
        return await self.core.db.run(lambda c: cluster_store.cluster_info(c, now), read_only=True)

    async def events(self, kind: str, object_id: str, user: str = "") -> list[Event]:
        """(time, state, reason) of every state the object entered, oldest first (the
        last 1000). `kind` is one of EVENT_TABLES (checked by the caller); `user` names a
        demand's user. NotFound for an unknown ticket or demand."""
        return await self.core.db.run(
            lambda c: cluster_store.state_events(c, kind, object_id, user), read_only=True
        )

    async def counts(self, user: str) -> ClusterCounts:
        """The overview's counts as `user` sees them ("" for an operator: everyone's)."""
        db = self.core.db
        return await db.run(
            lambda c: overview.cluster_counts(c, user), read_only=True, bound=db.slow_timeout
        )
