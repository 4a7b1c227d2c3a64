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
(cross-site requests): console/guard.py.

The lists are lists.py's, the pages of one object and the actions pages.py's; what they
compute is kept for everyone who looks for `console_refresh` seconds (cache.py)."""

from __future__ import annotations

import logging
import mimetypes
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from google.protobuf.message import Message

from rm_server.app.agents import AgentHub
from rm_server.app.core import RMCore
from rm_server.app.demands import DemandManager
from rm_server.app.engineconns import EngineConnManager
from rm_server.console.cache import ViewCache
from rm_server.console.guard import HostGuard, Refused
from rm_server.console.lists import Lists
from rm_server.console.pages import Pages
from rm_server.console.reply import reply
from rm_server.errors import (
    LabelrmError,
    PermissionDenied,
    Unauthenticated,
)
from rm_server.security import policy
from rm_server.security.identity import DEV_ADMIN, Principal
from rm_server.security.interceptor import AuthInterceptor
from rm_server.security.setup import Security
from rm_server.service.errors import http_status_of

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
# Browsers run module scripts only when served as JavaScript; not every mime.types knows .mjs
mimetypes.add_type("text/javascript", ".mjs")

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
        # Each view computed once per `console_refresh` for every browser that polls it.
        self.cache = ViewCache()
        self.api = Api(sources, self.cache)
        hosts = sources.security.settings.console_hosts.split(",")
        self.guard = HostGuard.of(listen.rpartition(":")[0].strip("[]"), hosts)

    @property
    def url(self) -> str:
        host = self.listen.rpartition(":")[0].strip("[]") or "127.0.0.1"
        return f"{self.scheme}://{host}:{self.port}/"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._guard])
        api = self.api
        lists = Lists(api)
        pages = Pages(api, lists)
        app.add_routes(
            [
                web.get("/api/me", api.me),
                web.get("/api/overview", pages.overview),
                web.get("/api/nodes", lists.nodes),
                web.get("/api/nodes/{id}", pages.node),
                web.post("/api/nodes/{id}/cordon", pages.cordon_node),
                web.post("/api/nodes/{id}/uncordon", pages.uncordon_node),
                web.post("/api/nodes/{id}/decommission", pages.decommission_node),
                web.get("/api/engineconns", lists.engine_conns),
                web.get("/api/engineconns/{id}", pages.engine_conn),
                web.get("/api/engineconns/{id}/logs", pages.engine_conn_logs),
                web.post("/api/engineconns/{id}/kill", pages.kill_engine_conn),
                web.get("/api/resources", lists.resources),
                web.get("/api/tickets", lists.tickets),
                web.get("/api/tickets/{id}", pages.ticket),
                web.get("/api/demands", lists.demands),
                web.get("/api/demands/{user}/{id}", pages.demand),
                web.get("/api/usage", pages.usage),
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
            response = reply({"error": refused.message}, status=refused.status)
        except LabelrmError as err:
            status = http_status_of(err)  # the code the RPC would answer, as HTTP
            if status >= 500:
                log.warning("console %s: %s", request.path, err.message)
            response = reply({"error": err.message}, status=status)
        except web.HTTPException as exc:  # no such route, wrong method: JSON too
            if exc.status < 400:
                raise
            response = reply({"error": exc.reason}, status=exc.status)
        except Exception as exc:  # the database away, a bug: one line, no traceback
            log.warning("console %s failed: %s: %s", request.path, type(exc).__name__, exc)
            response = reply({"error": "the RM cannot answer now"}, status=503)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"
        )
        return response


async def _index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html")


class Api:
    """Who is calling and what they may see (the RPCs' policy), and the views' cache:
    what lists.py and pages.py answer with."""

    def __init__(self, src: Sources, cache: ViewCache) -> None:
        self.src = src
        settings = src.security.settings
        self.cache = cache
        self.refresh = settings.console_refresh
        self.list_rows = settings.console_list_rows

    # ----- who is calling, and may they ---------------------------------------------------

    def principal(self, request: web.Request) -> Principal:
        auth = self.src.auth
        if not auth.enabled:
            return DEV_ADMIN
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not token:
            raise Unauthenticated("sign in with a bearer token")
        principal = auth.principal_of_token(token, request.remote or "")
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
        """The user a list is scoped to: the caller; for admins and proxy users the user
        `message` names, "" (everyone) when it names none."""
        await self.allow(principal, method, message)
        return str(message.user)

    # ----- views -------------------------------------------------------------------------

    async def me(self, request: web.Request) -> web.Response:
        p = self.principal(request)
        return reply(
            {"user": p.name or "(dev mode)", "admin": p.is_admin, "auth": self.src.auth.enabled}
        )
