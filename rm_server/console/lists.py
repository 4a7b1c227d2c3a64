"""The console's lists: nodes, EngineConns, tickets, demands and label records, each a
page (`listing.page`) of a snapshot that is read once per refresh for everyone who looks.

A snapshot holds the newest `console_list_rows` rows of what the user may list (the RPC's
scope: a user's own, an admin's everyone's or one user's) in the state the page's facet
picks (filtered by the database), with the counts by state of the whole scope. Filter
text, sort order and page are applied to the snapshot in memory, and the page computed
for one browser is kept for the others that ask the same. A list longer than the cap
says so (`selected` > `kept`): the page tells how to narrow it."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from aiohttp import web
from labelrm.v1 import admin_pb2, demand_pb2, engine_conn_pb2, resource_manager_pb2

from rm_server.console import views
from rm_server.console.listing import PageQuery, Snapshot, SortKey, page, page_query
from rm_server.console.reply import body, raw
from rm_server.domain.demands.state import DemandState
from rm_server.domain.engineconn import ENDED_STATES, LIVE_STATES, EcState
from rm_server.domain.labels import EM_INSTANCE, Label
from rm_server.domain.model import LabelResource, TicketState
from rm_server.errors import InvalidArgument
from rm_server.security import policy

if TYPE_CHECKING:
    from rm_server.console.app import Api

Json = views.Json

# Resources over time: one sample a minute over the last hour, kept for half a minute
# (the figures move by the minute).
USAGE_SAMPLES = 60
USAGE_STEP = 60.0
USAGE_TTL = 30.0
TOP_GROUPS = 50  # groups of the by-user and by-engine-type totals shown


def _mem(field: str) -> SortKey:
    return lambda r: ((r.get(field) or {}).get("dims") or {}).get("memory_bytes")


NODE_SORTS: dict[str, SortKey] = {
    "instance": lambda r: r["instance"],
    "state": lambda r: r["state"],
    "total": _mem("total"),
    "left": _mem("left"),
    "engineconns": lambda r: r["live_engine_conns"],
    "heartbeat": lambda r: r["last_heartbeat_at"],
}
EC_SORTS: dict[str, SortKey] = {
    "id": lambda r: r["id"],
    "user": lambda r: r["user"],
    "engine": lambda r: r["engine"],
    "state": lambda r: r["state"],
    "node": lambda r: r["node"] or None,
    "memory": _mem("resource"),
    "created": lambda r: r["created_at"],
    "ended": lambda r: r["ended_at"],
    "reason": lambda r: r["reason"] or None,
}
TICKET_SORTS: dict[str, SortKey] = {
    "id": lambda r: r["id"],
    "user": lambda r: r["user"],
    "state": lambda r: r["state"],
    "locked": _mem("locked"),
    "used": _mem("used"),
    "created": lambda r: r["created_at"],
}
DEMAND_SORTS: dict[str, SortKey] = {
    "id": lambda r: r["id"],
    "user": lambda r: r["user"],
    "state": lambda r: r["state"],
    "memory": _mem("resource"),
    "planned_start": lambda r: r["planned_start"],
    "deadline": lambda r: r["deadline"],
    "submitted": lambda r: r["submitted_at"],
}
LABEL_SORTS: dict[str, SortKey] = {
    "label": lambda r: r["label"],
    "source": lambda r: r["source"],
    "use": lambda r: r["load"],
    "used": _mem("used"),
    "locked": _mem("locked"),
    "max": _mem("max"),
    "left": _mem("left"),
    "tickets": lambda r: r["live_tickets"],
}

_VERSIONS = itertools.count(1)


def states_of(
    value: str, known: Sequence[str], groups: Mapping[str, Sequence[str]]
) -> tuple[str, ...]:
    """The states a ``state`` facet picks: a group's, one state, or () for every state."""
    if value in ("", "all"):
        return ()
    if value in groups:
        return tuple(groups[value])
    if value in known:
        return (value,)
    choices = ", ".join(["all", *groups, *known])
    raise InvalidArgument("state", f"must be one of {choices}")


def _param(request: web.Request, name: str, most: int) -> str:
    value = request.query.get(name, "")
    if len(value) > most:
        raise InvalidArgument(name, f"must be at most {most} characters")
    return value


class Lists:
    """The list endpoints."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.src = api.src
        self.cache = api.cache

    async def _answer(
        self,
        request: web.Request,
        view: str,
        key: tuple[Hashable, ...],
        read: Callable[[], Awaitable[Snapshot]],
        sorts: Mapping[str, SortKey],
        default_sort: str,
        extra: Callable[[Json], Awaitable[Json]] | None = None,
    ) -> web.Response:
        """The page `request` asks for of the snapshot `read` makes (both shared)."""
        query = page_query(request.query, sorts, default_sort)
        snap = await self.cache.get(view, key, self.api.refresh, read)

        async def build() -> bytes:
            doc = page(snap, query, sorts)
            if extra is not None:
                doc.update(await extra(doc))
            return body(doc)

        page_key = (*key, snap.version, _query_key(query))
        return raw(await self.cache.get(view + "/page", page_key, self.api.refresh, build))

    def _snapshot(
        self, rows: Sequence[views.Row], selected: int, by_state: Mapping[str, int]
    ) -> Snapshot:
        kept = tuple(rows[: self.api.list_rows])
        return Snapshot(kept, selected, dict(by_state), next(_VERSIONS))

    # ----- nodes -----------------------------------------------------------------------------

    async def nodes(self, request: web.Request) -> web.Response:
        p = self.api.principal(request)
        await self.api.allow(p, policy.RM + "ListEcms", resource_manager_pb2.ListEcmsRequest())
        state = _param(request, "state", 20)
        if state not in ("", "all", "RUNNING", "DRAINING", "LOST"):
            raise InvalidArgument("state", "must be all, RUNNING, DRAINING or LOST")

        async def read() -> Snapshot:
            cap = self.api.list_rows
            statuses = await self.src.hub.list_ecm_status("", cap + 1)
            records = await self.src.core.capacity.list_label_resources("", cap + 1, "ecm")
            by_label = {r.label: r for r in records}
            counts: dict[str, int] = {}
            for s in statuses:
                counts[s.state.value] = counts.get(s.state.value, 0) + 1
            rows = [
                views.node_row(s, by_label.get(str(Label(EM_INSTANCE, s.instance))))
                for s in statuses
                if state in ("", "all") or s.state.value == state
            ]
            return self._snapshot(rows, len(rows), counts)

        return await self._answer(request, "nodes", (state,), read, NODE_SORTS, "instance")

    # ----- EngineConns -----------------------------------------------------------------------

    async def engine_conns(self, request: web.Request) -> web.Response:
        """ListEngineConns' scope; ended EngineConns only when the ``state`` facet asks
        (default ``live``)."""
        p = self.api.principal(request)
        user = await self.api.own_user(
            p,
            policy.EC + "ListEngineConns",
            engine_conn_pb2.ListEngineConnsRequest(user=_param(request, "user", 256)),
        )
        node = _param(request, "node", 300)
        groups = {
            "live": [s.value for s in LIVE_STATES],
            "ended": sorted(s.value for s in ENDED_STATES),
        }
        states = states_of(request.query.get("state", "live"), [s.value for s in EcState], groups)

        async def read() -> Snapshot:
            found = await self.src.core.listings.engine_conns(
                user, "", node, states, self.api.list_rows
            )
            selected = sum(n for s, n in found.by_state.items() if not states or s in states)
            return self._snapshot(
                [views.engine_conn_row(e) for e in found.rows], selected, found.by_state
            )

        key = (user, node, states)
        return await self._answer(request, "engineconns", key, read, EC_SORTS, "-created")

    # ----- tickets ---------------------------------------------------------------------------

    async def tickets(self, request: web.Request) -> web.Response:
        p = self.api.principal(request)
        user = await self.api.own_user(
            p,
            policy.RM + "ListTickets",
            resource_manager_pb2.ListTicketsRequest(user=_param(request, "user", 256)),
        )
        known = [s.value for s in TicketState if s.live]
        states = states_of(request.query.get("state", ""), known, {})

        async def read() -> Snapshot:
            found = await self.src.core.listings.tickets(user, "", states, self.api.list_rows)
            selected = sum(n for s, n in found.by_state.items() if not states or s in states)
            return self._snapshot(
                [views.ticket_row(t) for t in found.rows], selected, found.by_state
            )

        return await self._answer(
            request, "tickets", (user, states), read, TICKET_SORTS, "-created"
        )

    # ----- demands ---------------------------------------------------------------------------

    async def demands(self, request: web.Request) -> web.Response:
        p = self.api.principal(request)
        user = await self.api.own_user(
            p,
            policy.DEMAND + "ListDemands",
            demand_pb2.ListDemandsRequest(user=_param(request, "user", 256)),
        )
        active = [s.value for s in DemandState if not s.terminal]
        groups = {"active": active, "ended": [s.value for s in DemandState if s.terminal]}
        states = states_of(request.query.get("state", ""), [s.value for s in DemandState], groups)

        async def read() -> Snapshot:
            found = await self.src.core.listings.demands(user, "", states, self.api.list_rows)
            selected = sum(n for s, n in found.by_state.items() if not states or s in states)
            return self._snapshot(
                [views.demand_row(d) for d in found.rows], selected, found.by_state
            )

        key = (user, states)
        return await self._answer(request, "demands", key, read, DEMAND_SORTS, "planned_start")

    # ----- label records ---------------------------------------------------------------------

    async def labels(self) -> list[LabelResource]:
        """Every label record up to the cap (and one more: a longer list is cut), shared by
        the resources list and the overview."""
        cap = self.api.list_rows

        async def read() -> list[LabelResource]:
            return await self.src.core.capacity.list_label_resources("", cap + 1, "")

        return await self.cache.get("labels", (), self.api.refresh, read)

    async def resources(self, request: web.Request) -> web.Response:
        """ListLabelResources' records (each with the limit that applies to it, its use
        over the last hour), and for those who may: the limits, the external providers,
        and live tickets summed per user and per engine type."""
        p = self.api.principal(request)
        await self.api.allow(
            p, policy.RM + "ListLabelResources", resource_manager_pb2.ListLabelResourcesRequest()
        )
        source = _param(request, "source", 20)
        source = "" if source == "all" else source
        may_limits = await self.api.may(
            p, policy.ADMIN + "ListLabelLimits", admin_pb2.ListLabelLimitsRequest()
        )
        may_providers = await self.api.may(
            p, policy.ADMIN + "ListExternalProviders", admin_pb2.ListExternalProvidersRequest()
        )
        user = await self.api.own_user(
            p, policy.RM + "ListTickets", resource_manager_pb2.ListTicketsRequest()
        )

        async def read() -> Snapshot:
            records = await self.labels()
            stored = await self.src.core.capacity.list_limits("", 100_000) if may_limits else []
            rules = views.limit_rules(stored)
            counts: dict[str, int] = {}
            rows = []
            for r in records[: self.api.list_rows]:
                counts[r.source] = counts.get(r.source, 0) + 1
                if source and r.source != source:
                    continue
                limit = views.winning_limit(r.label, rules) if rules else ""
                rows.append(views.label_row(r, limit))
            selected = len(rows) + (len(records) > self.api.list_rows)  # more: cut
            return self._snapshot(rows, selected, counts)

        async def extra(doc: Json) -> Json:
            out: Json = {"usage": await self.usage([r["label"] for r in doc["rows"]])}
            out["limits"] = await self._limits() if may_limits else None
            out["providers"] = await self._providers() if may_providers else None
            out["by_user"] = await self._totals(user, "user")
            out["by_engine_type"] = await self._totals(user, "engine_type")
            return out

        key = (source, may_limits, may_providers, user)
        return await self._answer(request, "resources", key, read, LABEL_SORTS, "label", extra)

    async def _limits(self) -> list[Json]:
        async def read() -> list[Json]:
            return [
                views.limit(lim) for lim in await self.src.core.capacity.list_limits("", 100_000)
            ]

        return await self.cache.get("limits", (), self.api.refresh, read)

    async def _providers(self) -> list[Json] | None:
        external = self.src.core.external
        if external is None:
            return None

        async def read() -> list[Json]:
            return [views.provider(c) for c in await external.list_providers()]

        return await self.cache.get("providers", (), self.api.refresh, read)

    async def _totals(self, user: str, by: str) -> Json:
        async def read() -> Json:
            groups, count = await self.src.core.listings.ticket_totals(user, by, TOP_GROUPS)
            return views.totals(groups, count)

        return await self.cache.get("totals", (user, by), self.api.refresh, read)

    async def usage(self, labels: Sequence[str]) -> dict[str, Json]:
        """Each label's held resources over the last hour, a sample a minute (the samples
        fall on whole minutes, so every browser asks for the same)."""
        if not labels:
            return {}
        now = self.src.core.clock.now()
        last = now.replace(second=0, microsecond=0)
        since = last - timedelta(seconds=USAGE_STEP * (USAGE_SAMPLES - 1))

        async def read() -> dict[str, Json]:
            series = await self.src.core.listings.held(labels, since, USAGE_STEP, USAGE_SAMPLES)
            return {lb: views.usage(series.get(lb, {}), since, USAGE_STEP) for lb in labels}

        return await self.cache.get("usage", (tuple(labels), since), USAGE_TTL, read)


def _selected(by_state: Mapping[str, int], states: Sequence[str]) -> int:
    """How many rows the facet picks (all of them for no facet)."""
    return sum(n for s, n in by_state.items() if not states or s in states)


def _query_key(query: PageQuery) -> tuple[Any, ...]:
    return (query.q, query.sort, query.desc, query.offset, query.limit)
