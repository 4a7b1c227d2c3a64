"""The console's pages of one thing (the overview, a node, an EngineConn and its logs, a
ticket, a demand, the usage of a period) and its actions (kill an EngineConn, drain a
node). Each page is authorized as the RPC it mirrors, then computed once per refresh for
every browser that shows it (cache.py); an action drops what it changed from the cache."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from aiohttp import web
from labelrm.v1 import admin_pb2, demand_pb2, engine_conn_pb2, resource_manager_pb2, usage_pb2

from rm_server.console import logs, views
from rm_server.console.reply import body, raw, reply
from rm_server.domain.engineconn import EcmState, EngineConn
from rm_server.domain.labels import EM_INSTANCE, Label
from rm_server.domain.model import LabelResource
from rm_server.domain.usage import HOUR, UsageQuery, hour_of
from rm_server.errors import InvalidArgument, NotFound
from rm_server.security import policy

if TYPE_CHECKING:
    from rm_server.console.app import Api
    from rm_server.console.lists import Lists

log = logging.getLogger(__name__)

CONSISTENCY_TTL = 15.0  # CheckConsistency reads every live ticket: at most once per this
MOST_LOADED = 8  # labels on the overview
NODE_ENGINE_CONNS = 200  # an EngineConn list on a node's page (the newest)
MAX_USAGE_DAYS = 31  # the Usage page's longest period (744 hours on its chart)
USAGE_GROUPS = 2000  # the Usage page's table: at most this many users or engine types


def _id(request: web.Request, name: str = "id", most: int = 256) -> str:
    value = request.match_info[name]
    if not value or len(value) > most:
        raise InvalidArgument(name, f"must be 1 to {most} characters")
    return value


class Pages:
    """The pages and actions."""

    def __init__(self, api: Api, lists: Lists) -> None:
        self.api = api
        self.lists = lists
        self.src = api.src
        self.cache = api.cache

    # ----- overview --------------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        p = self.api.principal(request)
        await self.api.allow(p, policy.RM + "ListEcms", resource_manager_pb2.ListEcmsRequest())
        user = await self.api.own_user(
            p, policy.EC + "ListEngineConns", engine_conn_pb2.ListEngineConnsRequest()
        )
        may_check = await self.api.may(
            p, policy.ADMIN + "CheckConsistency", admin_pb2.CheckConsistencyRequest()
        )

        async def build() -> bytes:
            counts = await self.src.core.cluster.counts(user)
            tickets = await self.src.core.listings.tickets(user, "", (), 0)
            doc = {
                **await self._cluster(),
                "scope": user or "all",
                "engine_conns": counts.engine_conns,
                "demands": counts.demands,
                "tickets": tickets.by_state,
                "waiting_applies": counts.waiting_applies,
                "replicas": [
                    {"host": r.host, "pid": r.pid, "started_at": views.at(r.started_at)}
                    for r in counts.replicas
                ],
                "database": "up",
                "tickets_by_user": dict(counts.top_users),
                "consistency": await self._consistency() if may_check else None,
            }
            return body(doc)

        return raw(await self.cache.get("overview", (user, may_check), self.api.refresh, build))

    async def _cluster(self) -> views.Json:
        """What every user's overview shows alike: nodes by state, the cluster's totals
        (the ECMs' records), the most loaded labels with their last hour."""

        async def build() -> views.Json:
            cap = self.api.list_rows
            nodes: dict[str, int] = {}
            lost: set[str] = set()
            for s in await self.src.hub.list_ecm_status("", cap):
                nodes[s.state.value] = nodes.get(s.state.value, 0) + 1
                if s.state is EcmState.LOST:
                    lost.add(str(Label(EM_INSTANCE, s.instance)))
            # The totals are the capacity of the nodes that are there: a LOST node's is
            # not (rmctl status counts the same way).
            ecms = [
                r
                for r in await self.src.core.capacity.list_label_resources("", cap, "ecm")
                if r.label not in lost
            ]
            records = await self.lists.labels()
            loaded = sorted(
                (r for r in records if r.max_resource is not None and views.load(r) > 0),
                key=lambda r: (-views.load(r), r.label),
            )[:MOST_LOADED]
            usage = await self.lists.usage([r.label for r in loaded])
            return {
                "nodes": nodes,
                "totals": views.cluster_totals(ecms),
                "loaded": [
                    {**views.label_resource(r), "load": views.load(r), "usage": usage.get(r.label)}
                    for r in loaded
                ],
            }

        return await self.cache.get("cluster", (), self.api.refresh, build)

    async def _consistency(self) -> views.Json:
        async def build() -> views.Json:
            report = await self.src.core.consistency.check()
            return views.consistency(report, self.src.core.clock.now())

        ttl = max(CONSISTENCY_TTL, self.api.refresh)
        return await self.cache.get("consistency", (), ttl, build)

    # ----- nodes -----------------------------------------------------------------------------

    async def node(self, request: web.Request) -> web.Response:
        """GetEcm, with the node's EngineConns (ListEngineConns' scope) and, for those who
        may ListEvents, the states it went through."""
        p = self.api.principal(request)
        instance = _id(request, most=300)
        await self.api.allow(
            p, policy.RM + "GetEcm", resource_manager_pb2.GetEcmRequest(instance=instance)
        )
        user = await self.api.own_user(
            p, policy.EC + "ListEngineConns", engine_conn_pb2.ListEngineConnsRequest()
        )
        may_events = await self.api.may(
            p, policy.ADMIN + "ListEvents", admin_pb2.ListEventsRequest()
        )
        may_act = await self.api.may(p, policy.ADMIN + "CordonEcm", admin_pb2.CordonEcmRequest())

        async def build() -> bytes:
            status = await self.src.hub.ecm_status(instance)
            record: LabelResource | None
            try:
                record = await self.src.core.capacity.get_label_resource(
                    str(Label(EM_INSTANCE, instance))
                )
            except NotFound:
                record = None
            found = await self.src.core.listings.engine_conns(
                user, "", instance, (), NODE_ENGINE_CONNS
            )
            events = await self.src.core.cluster.events("node", instance) if may_events else None
            doc = {
                "node": views.node(status, record),
                "engine_conns": [views.engine_conn(e) for e in found.rows],
                "engine_conns_by_state": found.by_state,
                "events": views.events(events) if events is not None else None,
                "may_act": may_act,  # cordon, drain, decommission (admins)
            }
            return body(doc)

        key = (instance, user, may_events, may_act)
        return raw(await self.cache.get("node", key, self.api.refresh, build))

    async def decommission_node(self, request: web.Request) -> web.Response:
        """DecommissionEcm (admins): the node takes no new EngineConns and leaves once its
        last one has ended."""
        p = self.api.principal(request)
        instance = _id(request, most=300)
        await self.api.allow(
            p,
            policy.ADMIN + "DecommissionEcm",
            admin_pb2.DecommissionEcmRequest(instance=instance),
        )
        live = await self.src.hub.decommission(instance)
        log.info("console: %s decommissions ECM %s", p.describe(), instance)
        self._forget_nodes()
        return reply({"instance": instance, "live_engine_conns": live})

    async def cordon_node(self, request: web.Request) -> web.Response:
        """CordonEcm (admins), with the ``reason`` the page gives: no new work on the node,
        what runs there goes on (a drain is a cordon watched until none is left)."""
        p = self.api.principal(request)
        instance = _id(request, most=300)
        reason = request.query.get("reason", "")
        if len(reason) > 500:
            raise InvalidArgument("reason", "must be at most 500 characters")
        req = admin_pb2.CordonEcmRequest(instance=instance, reason=reason)
        await self.api.allow(p, policy.ADMIN + "CordonEcm", req)
        status = await self.src.hub.cordon(
            instance, True, reason or "cordoned from the web console"
        )
        log.info("console: %s cordons ECM %s", p.describe(), instance)
        self._forget_nodes()
        return reply({"node": views.node(status, None)})

    async def uncordon_node(self, request: web.Request) -> web.Response:
        """UncordonEcm (admins): the node takes new work again (a decommission in
        progress is called off)."""
        p = self.api.principal(request)
        instance = _id(request, most=300)
        req = admin_pb2.UncordonEcmRequest(instance=instance)
        await self.api.allow(p, policy.ADMIN + "UncordonEcm", req)
        status = await self.src.hub.cordon(instance, False)
        log.info("console: %s uncordons ECM %s", p.describe(), instance)
        self._forget_nodes()
        return reply({"node": views.node(status, None)})

    def _forget_nodes(self) -> None:
        """What a node action changed, recomputed at the next read."""
        for view in ("node", "nodes", "nodes/page", "cluster", "overview"):
            self.cache.forget(view)

    # ----- EngineConns -----------------------------------------------------------------------

    async def _engine_conn(self, ec_id: str) -> EngineConn:
        return await self.cache.get(
            "ec", (ec_id,), self.api.refresh, lambda: self.src.ecs.get(ec_id)
        )

    async def engine_conn(self, request: web.Request) -> web.Response:
        """GetEngineConn, with the states it went through (its own history, under the same
        rule: its owner and admins)."""
        p = self.api.principal(request)
        ec_id = _id(request, most=128)
        await self.api.allow(
            p,
            policy.EC + "GetEngineConn",
            engine_conn_pb2.GetEngineConnRequest(engine_conn_id=ec_id),
        )

        async def build() -> bytes:
            ec = await self._engine_conn(ec_id)
            events = await self.src.core.cluster.events("engineconn", ec_id)
            return body(
                {"engine_conn": views.engine_conn(ec, full=True), "events": views.events(events)}
            )

        return raw(await self.cache.get("engineconn", (ec_id,), self.api.refresh, build))

    async def engine_conn_logs(self, request: web.Request) -> web.Response:
        """What its log files gained since the offsets the page read (``stdout.log=N``
        ...), when they are readable from the RM's host (`logs`); GetEngineConn's rule."""
        p = self.api.principal(request)
        ec_id = _id(request, most=128)
        await self.api.allow(
            p,
            policy.EC + "GetEngineConn",
            engine_conn_pb2.GetEngineConnRequest(engine_conn_id=ec_id),
        )
        offsets: dict[str, int] = {}
        for name in logs.LOG_FILES:
            raw_offset = request.query.get(name, "")
            if raw_offset:
                if not raw_offset.isdigit() or len(raw_offset) > 18:
                    raise InvalidArgument(name, "must be a byte offset")
                offsets[name] = int(raw_offset)
        ec = await self._engine_conn(ec_id)
        uid = logs.uid_of(ec.user)
        files = None
        if ec.work_dir and uid is not None:
            files = await asyncio.to_thread(logs.read_new, ec.work_dir, uid, offsets)
        where = (
            f"on ECM {ec.ecm_instance or '?'} in {ec.work_dir}/logs" if ec.work_dir
            else "nowhere yet: it has no work directory"
        )  # fmt: skip
        return reply(
            {"state": ec.state.value, "live": ec.state.live, "files": files, "where": where}
        )

    async def kill_engine_conn(self, request: web.Request) -> web.Response:
        """KillEngineConn, for its owner and admins (the RPC's rule). The token travels in
        a header, never a cookie: another site's page cannot make a browser send it."""
        p = self.api.principal(request)
        ec_id = _id(request, most=128)
        await self.api.allow(
            p,
            policy.EC + "KillEngineConn",
            engine_conn_pb2.KillEngineConnRequest(engine_conn_id=ec_id),
        )
        ec = await self.src.ecs.kill(ec_id, "killed from the web console")
        log.info("console: %s killed EngineConn %s", p.describe(), ec_id)
        for view in ("ec", "engineconn", "engineconns", "engineconns/page"):
            self.cache.forget(view)
        return reply({"engine_conn": views.engine_conn(ec, full=True)})

    # ----- tickets and demands ---------------------------------------------------------------

    async def ticket(self, request: web.Request) -> web.Response:
        """GetTicket (live or ended), with the states it went through."""
        p = self.api.principal(request)
        ticket_id = _id(request, most=128)
        await self.api.allow(
            p, policy.RM + "GetTicket", resource_manager_pb2.GetTicketRequest(ticket_id=ticket_id)
        )

        async def build() -> bytes:
            t = await self.src.core.tickets.get_ticket(ticket_id)
            events = await self.src.core.cluster.events("ticket", ticket_id)
            return body({"ticket": views.ticket(t, full=True), "events": views.events(events)})

        return raw(await self.cache.get("ticket", (ticket_id,), self.api.refresh, build))

    async def demand(self, request: web.Request) -> web.Response:
        """GetDemand of (user, id), with its transitions."""
        p = self.api.principal(request)
        user, demand_id = _id(request, "user"), _id(request, most=128)
        req = demand_pb2.GetDemandRequest(demand_id=demand_id, user=user)
        await self.api.allow(p, policy.DEMAND + "GetDemand", req)

        async def build() -> bytes:
            d = await self.src.demands.get(user, demand_id)
            return body({"demand": views.demand(d, full=True)})

        return raw(await self.cache.get("demand", (user, demand_id), self.api.refresh, build))

    # ----- usage -------------------------------------------------------------------------

    async def usage(self, request: web.Request) -> web.Response:
        """GetUsage for the Usage page: the last `days` (1-31) by hour (the chart), and
        by user for those who see everyone's, by engine type for a user."""
        p = self.api.principal(request)
        user = await self.api.own_user(p, policy.USAGE + "GetUsage", usage_pb2.GetUsageRequest())
        text = request.query.get("days", "7")
        if not text.isdigit() or not 1 <= int(text) <= MAX_USAGE_DAYS:
            raise InvalidArgument("days", f"must be a whole number from 1 to {MAX_USAGE_DAYS}")
        until = hour_of(self.src.core.clock.now()) + HOUR
        since = until - timedelta(days=int(text))
        group_by = "engine_type" if user else "user"

        async def build() -> bytes:
            async def report(grouping: str) -> list[views.Json]:
                query = UsageQuery(grouping, since, until, user or None, "", USAGE_GROUPS)
                return [views.usage_group(g) for g in await self.src.core.usage.report(query)]

            doc = {
                "since": views.at(since),
                "until": views.at(until),
                "group_by": group_by,
                "hours": await report("hour"),
                "groups": await report(group_by),
            }
            return body(doc)

        key = (user, int(text), until)
        return raw(await self.cache.get("usage", key, self.api.refresh, build))
