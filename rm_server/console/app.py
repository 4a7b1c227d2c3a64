"""The web console: an aiohttp application on its own listener (``console_listen``),
serving the single-page front end (static/, every asset in the package: no CDN) and
JSON endpoints under /api/.

Every endpoint reads through the same use cases (rm_server/app/) as the RPCs,
and is authorized by THE access policy (security/policy.py) as the RPC it mirrors:
``/api/engineconns`` is ListEngineConns, ``/api/engineconns/{id}`` GetEngineConn, and
so on. The caller signs in with a bearer token from the RM's token file (the page keeps
it in the tab's session storage and sends it as ``Authorization: Bearer``; no cookie,
so no cross-site request can act with it). A user sees their own tickets, EngineConns
and demands, plus the cluster's shape (nodes, label resources) that ListEcms and
ListLabelResources show every user; an admin sees everything.

Whatever the authentication mode (dev mode has none), the console answers only to the
addresses it listens on (DNS rebinding) and takes a change only from its own page
(cross-site requests): console/guard.py."""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from google.protobuf.message import Message
from labelrm.v1 import admin_pb2, demand_pb2, engine_conn_pb2, resource_manager_pb2

from rm_server.app.agents import AgentHub
from rm_server.app.core import RMCore
from rm_server.app.demands import DemandManager
from rm_server.app.engineconns import EngineConnManager
from rm_server.console import views
from rm_server.console.guard import HostGuard, Refused
from rm_server.domain.labels import EM_INSTANCE, Label
from rm_server.domain.model import LabelResource, Ticket
from rm_server.errors import (
    FailedPrecondition,
    InvalidArgument,
    LabelrmError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
)
from rm_server.security import policy
from rm_server.security.identity import DEV_ADMIN, Principal, from_token_entry
from rm_server.security.interceptor import AuthInterceptor
from rm_server.security.setup import Security

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
# Browsers run module scripts only when served as JavaScript; not every mime.types knows .mjs
mimetypes.add_type("text/javascript", ".mjs")
CONSISTENCY_TTL = 5.0
MAX_ROWS = 2000  # a list page shows at most this many rows (filters narrow it)

# The error hierarchy -> HTTP status (as service/errors.py maps it to gRPC codes).
_HTTP: tuple[tuple[type[LabelrmError], int], ...] = (
    (InvalidArgument, 400),
    (Unauthenticated, 401),
    (PermissionDenied, 403),
    (NotFound, 404),
    (FailedPrecondition, 409),
    (ResourceExhausted, 429),
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Sources:
    """What the console reads: the parts the servicers use."""

    core: RMCore
    hub: AgentHub
    ecs: EngineConnManager
    demands: DemandManager
    security: Security
    auth: AuthInterceptor


class Console:
    """The console's HTTP server (`build_security` has checked its listener: off loopback
    it needs TLS or --insecure, and tokens to sign in with)."""

    def __init__(self, sources: Sources, listen: str) -> None:
        self.src = sources
        self.listen = listen
        self.port = 0
        self.scheme = "https" if sources.security.settings.tls_cert else "http"
        self._runner: web.AppRunner | None = None
        hosts = sources.security.settings.console_hosts.split(",")
        self.guard = HostGuard.of(listen.rpartition(":")[0].strip("[]"), hosts)

    @property
    def url(self) -> str:
        host = self.listen.rpartition(":")[0].strip("[]") or "127.0.0.1"
        return f"{self.scheme}://{host}:{self.port}/"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._guard])
        api = Api(self.src)
        app.add_routes(
            [
                web.get("/api/me", api.me),
                web.get("/api/overview", api.overview),
                web.get("/api/nodes", api.nodes),
                web.get("/api/nodes/{id}", api.node),
                web.get("/api/engineconns", api.engine_conns),
                web.get("/api/engineconns/{id}", api.engine_conn),
                web.post("/api/engineconns/{id}/kill", api.kill_engine_conn),
                web.get("/api/resources", api.resources),
                web.get("/api/tickets", api.tickets),
                web.get("/api/demands", api.demands),
                web.get("/", _index),
                web.static("/static", STATIC, append_version=False),
            ]
        )
        return app

    async def start(self) -> None:
        st = self.src.security.settings
        context = None
        if st.tls_cert:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(st.tls_cert, st.tls_key)
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        host, _, port = self.listen.rpartition(":")
        site = web.TCPSite(self._runner, host.strip("[]") or None, int(port), ssl_context=context)
        await site.start()
        bound = self._runner.addresses
        self.port = int(bound[0][1]) if bound else int(port)
        log.info("console on %s", self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse what another web page could make a browser send (console/guard.py)."""
        self.guard.check(request.method, request.headers)
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except Refused as refused:  # not logged: any page could make a browser send many
            response = _reply({"error": refused.message}, status=refused.status)
        except LabelrmError as err:
            status = next((code for kind, code in _HTTP if isinstance(err, kind)), 500)
            if status >= 500:
                log.warning("console %s: %s", request.path, err.message)
            response = _reply({"error": err.message}, status=status)
        except web.HTTPException as exc:  # no such route, wrong method: JSON too
            if exc.status < 400:
                raise
            response = _reply({"error": exc.reason}, status=exc.status)
        except Exception as exc:  # the database away, a bug: one line, no traceback
            log.warning("console %s failed: %s: %s", request.path, type(exc).__name__, exc)
            response = _reply({"error": "the RM cannot answer now"}, status=503)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"
        )
        return response


def _reply(doc: Any, status: int = 200) -> web.Response:
    """A JSON answer, its strings as the page may show them (`views.shown`)."""
    return web.json_response(views.shown(doc), status=status)


async def _index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html")


class Api:
    """The JSON endpoints, one per view of the console."""

    def __init__(self, src: Sources) -> None:
        self.src = src
        # The consistency check reads every live ticket: one run serves every open
        # overview for CONSISTENCY_TTL seconds, however many poll it.
        self._consistency: tuple[float, views.Json] | None = None
        self._consistency_lock = asyncio.Lock()

    async def consistency(self) -> views.Json:
        async with self._consistency_lock:
            now = time.monotonic()
            if self._consistency is None or now - self._consistency[0] > CONSISTENCY_TTL:
                report = views.consistency(await self.src.core.consistency.check())
                self._consistency = (now, report)
            return self._consistency[1]

    # ----- who is calling, and may they ---------------------------------------------------

    def principal(self, request: web.Request) -> Principal:
        auth = self.src.auth
        if not auth.enabled:
            return DEV_ADMIN
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not token:
            raise Unauthenticated("sign in with a bearer token")
        peer = request.remote or ""
        found = auth.tokens.find(token) if auth.tokens is not None else None
        if found is None:
            auth.limits.check_peer(peer)
            auth.limits.auth_failed(peer)
            log.warning("console: invalid bearer token from %s", peer)
            raise Unauthenticated("invalid bearer token")
        key, entry = found
        principal = from_token_entry(entry.user, entry.roles, credential=key)
        if not principal.is_admin:
            auth.limits.admit_call(principal.name)
        return principal

    async def allow(self, principal: Principal, method: str, message: Message) -> None:
        """The policy's verdict on the RPC this view mirrors (may scope `message`)."""
        auth = self.src.auth
        if not auth.enabled:
            return
        try:
            await policy.authorize(
                method, principal, message, auth.owners, auth.proxy_users, auth.rules
            )
        except PermissionDenied as err:
            log.info("console refused: %s", err.message)
            raise

    async def may(self, principal: Principal, method: str, message: Message) -> bool:
        try:
            await self.allow(principal, method, message)
        except (PermissionDenied, Unauthenticated):
            return False
        return True

    async def own_user(self, principal: Principal, method: str, message: Any) -> str:
        """The user a list is scoped to: "" (everyone) for admins and proxy users."""
        await self.allow(principal, method, message)
        return str(message.user)

    # ----- views -------------------------------------------------------------------------

    async def me(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        return _reply(
            {"user": p.name or "(dev mode)", "admin": p.is_admin, "auth": self.src.auth.enabled}
        )

    async def overview(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        await self.allow(p, policy.RM + "ListEcms", resource_manager_pb2.ListEcmsRequest())
        user = await self.own_user(
            p, policy.EC + "ListEngineConns", engine_conn_pb2.ListEngineConnsRequest()
        )
        core = self.src.core
        nodes = await self.src.hub.list_ecm_status("", 10_000)
        records = await core.capacity.list_label_resources("", 100_000, "")
        counts = await core.cluster.counts(user)
        report = None
        if await self.may(
            p, policy.ADMIN + "CheckConsistency", admin_pb2.CheckConsistencyRequest()
        ):
            report = views.consistency(await core.consistency.check())
        node_states: dict[str, int] = {}
        for n in nodes:
            node_states[n.state.value] = node_states.get(n.state.value, 0) + 1
        return _reply(
            {
                "scope": user or "all",
                "nodes": node_states,
                "engine_conns": counts.engine_conns,
                "demands": counts.demands,
                "waiting_applies": counts.waiting_applies,
                "replicas": [
                    {
                        "id": r.replica_id,
                        "host": r.host,
                        "pid": r.pid,
                        "started_at": views.at(r.started_at),
                    }
                    for r in counts.replicas
                ],
                "database": "up",
                "labels": [views.label_resource(r) for r in records],
                "tickets_by_user": dict(counts.top_users),
                "consistency": report,
            }
        )

    async def nodes(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        await self.allow(p, policy.RM + "ListEcms", resource_manager_pb2.ListEcmsRequest())
        records = await self._ecm_records()
        out = []
        for s in await self.src.hub.list_ecm_status("", 10_000):
            out.append(views.node(s, _record_of(records, s.instance)))
        return _reply({"nodes": out})

    async def _ecm_records(self) -> dict[str, LabelResource]:
        """The ECMs' label records by label."""
        found = await self.src.core.capacity.list_label_resources("", 100_000, "ecm")
        return {r.label: r for r in found}

    async def node(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        instance = request.match_info["id"]
        await self.allow(
            p, policy.RM + "GetEcm", resource_manager_pb2.GetEcmRequest(instance=instance)
        )
        status = await self.src.hub.ecm_status(instance)
        records = await self._ecm_records()
        user = await self.own_user(
            p, policy.EC + "ListEngineConns", engine_conn_pb2.ListEngineConnsRequest()
        )
        ecs = await self.src.ecs.list("", MAX_ROWS, user, "", instance)
        return _reply(
            {
                "node": views.node(status, _record_of(records, instance)),
                "engine_conns": [views.engine_conn(e) for e in ecs],
            }
        )

    async def engine_conns(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        user = await self.own_user(
            p,
            policy.EC + "ListEngineConns",
            engine_conn_pb2.ListEngineConnsRequest(user=request.query.get("user", "")[:64]),
        )
        ecs = await self.src.ecs.list("", MAX_ROWS, user, "", request.query.get("node", "")[:300])
        return _reply({"engine_conns": [views.engine_conn(e) for e in ecs]})

    async def engine_conn(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        ec_id = request.match_info["id"][:128]
        await self.allow(
            p,
            policy.EC + "GetEngineConn",
            engine_conn_pb2.GetEngineConnRequest(engine_conn_id=ec_id),
        )
        ec = await self.src.ecs.get(ec_id)
        return _reply({"engine_conn": views.engine_conn(ec, full=True)})

    async def kill_engine_conn(self, request: web.Request) -> web.Response:
        """KillEngineConn, for its owner and admins (the RPC's rule). The token travels in
        a header, never a cookie: another site's page cannot make a browser send it."""
        p = self.principal(request)
        ec_id = request.match_info["id"][:128]
        await self.allow(
            p,
            policy.EC + "KillEngineConn",
            engine_conn_pb2.KillEngineConnRequest(engine_conn_id=ec_id),
        )
        ec = await self.src.ecs.kill(ec_id, "killed from the web console")
        log.info("console: %s killed EngineConn %s", p.describe(), ec_id)
        return _reply({"engine_conn": views.engine_conn(ec, full=True)})

    async def resources(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        await self.allow(
            p, policy.RM + "ListLabelResources", resource_manager_pb2.ListLabelResourcesRequest()
        )
        records = await self.src.core.capacity.list_label_resources("", 100_000, "")
        labels = [views.label_resource(r) for r in records]
        tickets = await self._tickets(p)
        limits = None
        if await self.may(p, policy.ADMIN + "ListLabelLimits", admin_pb2.ListLabelLimitsRequest()):
            stored = await self.src.core.capacity.list_limits("", 100_000)
            limits = [views.limit(lim) for lim in stored]
            for label in labels:
                label["limit"] = views.winning_limit(label["label"], stored)
        providers = None
        external = self.src.core.external
        if external is not None and await self.may(
            p, policy.ADMIN + "ListExternalProviders", admin_pb2.ListExternalProvidersRequest()
        ):
            providers = [views.provider(c) for c in await external.list_providers()]
        return _reply(
            {
                "labels": labels,
                "limits": limits,
                "providers": providers,
                "by_user": views.totals_by(tickets, lambda t: t.user),
                "by_engine_type": views.totals_by(tickets, views.engine_type),
            }
        )

    async def tickets(self, request: web.Request) -> web.Response:
        found = await self._tickets(self.principal(request))
        return _reply({"tickets": [views.ticket(t) for t in found]})

    async def _tickets(self, p: Principal) -> list[Ticket]:
        """The live tickets `p` may list, as ListTickets reads them."""
        user = await self.own_user(
            p, policy.RM + "ListTickets", resource_manager_pb2.ListTicketsRequest()
        )
        # As ListTickets does: every caller but admins sees only their own.
        return await self.src.core.tickets.list_tickets("", MAX_ROWS, "", "", user or None)

    async def demands(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        user = await self.own_user(
            p, policy.DEMAND + "ListDemands", demand_pb2.ListDemandsRequest()
        )
        found = await self.src.demands.list_demands(("", ""), MAX_ROWS, "", user)
        return _reply({"demands": [views.demand(d) for d in found]})


def _record_of(records: dict[str, Any], instance: str) -> Any:
    """The label record of an ECM (its label is ``emInstance=<instance>``)."""
    return records.get(str(Label(EM_INSTANCE, instance)))
