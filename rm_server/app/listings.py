"""Lists and aggregates for people looking at the cluster (the web console): bounded
reads of the newest tickets, EngineConns and demands with their counts by state, live
tickets summed per group, and each label's held resources over the last hour. Every
read is one read-only transaction (store/listings.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from rm_server.app.shared import Shared
from rm_server.domain.demands.model import Demand
from rm_server.domain.engineconn import EngineConn
from rm_server.domain.model import Ticket
from rm_server.store import listings as store
from rm_server.store.listings import GroupTotal, Recent

__all__ = ["GroupTotal", "Listings", "Recent", "series"]

# A label's series: dimension -> what it held at each sample.
Series = dict[str, list[int]]


class Listings:
    """The console's reads (see the module doc)."""

    def __init__(self, core: Shared) -> None:
        self.core = core

    async def tickets(
        self, user: str, owner: str, states: Sequence[str], limit: int
    ) -> Recent[Ticket]:
        """At most `limit` live tickets, newest first, of `user` ("" for everyone's) or
        of the `owner` an operator picked, in `states` (() for all), with the counts by
        state of the same user's."""
        return await self.core.db.run(
            lambda c: store.recent_tickets(c, user, owner, states, limit), read_only=True
        )

    async def engine_conns(
        self, user: str, owner: str, node: str, states: Sequence[str], limit: int
    ) -> Recent[EngineConn]:
        """EngineConns as `tickets` reads tickets, on ECM `node` ("" for all)."""
        return await self.core.db.run(
            lambda c: store.recent_engine_conns(c, user, owner, node, states, limit),
            read_only=True,
        )

    async def demands(
        self, user: str, owner: str, states: Sequence[str], limit: int
    ) -> Recent[Demand]:
        """Demands as `tickets` reads tickets, the most recently submitted first."""
        return await self.core.db.run(
            lambda c: store.recent_demands(c, user, owner, states, limit), read_only=True
        )

    async def ticket_totals(
        self, user: str, by: str, limit: int
    ) -> tuple[dict[str, GroupTotal], int]:
        """Every live ticket of `user` ("" for all) summed per "user" or "engine_type":
        the `limit` largest groups and the number of groups."""
        return await self.core.db.run(
            lambda c: store.ticket_totals(c, user, by, limit), read_only=True
        )

    async def held(
        self, labels: Sequence[str], since: datetime, step_seconds: float, samples: int
    ) -> dict[str, Series]:
        """What each of `labels` held at ``since + i * step`` for i < `samples`, per
        dimension (`series`)."""
        deltas = await self.core.db.run(
            lambda c: store.held_deltas(c, labels, since, step_seconds, samples),
            read_only=True,
        )
        return series(deltas, samples)


def series(deltas: Iterable[tuple[str, str, int, int]], samples: int) -> dict[str, Series]:
    """Per label and dimension, the running sum of (label, dimension, sample, change)
    changes at each sample: what was held at that moment. Never negative (a ticket's
    end is never counted before its start; the clamp guards a record read mid-change)."""
    changes: dict[str, dict[str, list[int]]] = {}
    for label, dim, sample, change in deltas:
        if 0 <= sample < samples:
            per_dim = changes.setdefault(label, {})
            per_dim.setdefault(dim, [0] * samples)[sample] += change
    out: dict[str, Series] = {}
    for label, per_dim in changes.items():
        out[label] = {}
        for dim, steps in per_dim.items():
            held, values = 0, []
            for change in steps:
                held += change
                values.append(max(0, held))
            out[label][dim] = values
    return out
