"""Assembles and runs the RM: database, notifier, core, a gRPC server per listener
(`listen`, and `agent_listen` when set: each with its own receive limit) with the
server's interceptor, reflection and the standard health service."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from labelrm.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    demand_pb2,
    demand_pb2_grpc,
    engine_conn_pb2,
    engine_conn_pb2_grpc,
    resource_manager_pb2,
    resource_manager_pb2_grpc,
    usage_pb2,
    usage_pb2_grpc,
)

from labelrm_common.signals import stop_signals
from rm_server.agent_process import AgentProcess, child_settings
from rm_server.app.agents import AgentHub
from rm_server.app.background import Lease, run_periodically
from rm_server.app.core import CoreSettings, RMCore
from rm_server.app.demand_planner import DemandSettings
from rm_server.app.demands import DemandManager
from rm_server.app.engineconns import EcSettings, EngineConnManager
from rm_server.app.owners import DbOwners
from rm_server.app.providers import ExternalResources
from rm_server.clock import Clock, IdFactory, SystemClock, random_ids
from rm_server.config import Settings
from rm_server.console.app import Console, Sources
from rm_server.domain.demands.planner import PlannerSettings
from rm_server.domain.labels import parse_rules
from rm_server.embedded import EmbeddedPostgres
from rm_server.external.secrets import SecretSource
from rm_server.observability.endpoint import MetricsHttpServer
from rm_server.observability.metrics import Metrics
from rm_server.security.setup import Security, build_security
from rm_server.service.admin import AdminServicer
from rm_server.service.demand import DemandServicer
from rm_server.service.engine_conn import EngineConnServicer
from rm_server.service.interceptor import Interceptor
from rm_server.service.resource_manager import ResourceManagerServicer
from rm_server.service.usage import UsageServicer
from rm_server.store import Database, LabelNotifier

# Calls that reached the server but wait for a handler (see grpc.aio.server below).
PENDING_RPCS_SOFT_LIMIT = 20_000
PENDING_RPCS_HARD_LIMIT = 40_000

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    resource_manager_pb2.DESCRIPTOR.services_by_name["ResourceManagerService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    engine_conn_pb2.DESCRIPTOR.services_by_name["EngineConnService"].full_name,
    demand_pb2.DESCRIPTOR.services_by_name["DemandService"].full_name,
    usage_pb2.DESCRIPTOR.services_by_name["UsageService"].full_name,
)


# The cyclic collector's thresholds for a serving process (gc.set_threshold): a young
# collection after 5,000 net allocations instead of 700. With Python's defaults an object
# that lives across a few awaits (a heartbeat's messages and futures, some milliseconds
# at 3,000 beats a second) survives two young collections and lands in the old
# generation; those pile up until a full collection, which walks every live object:
# with 10,000 agents on one process ~800,000 (their streams), 300-480 ms a collection
# every ~10 s, the whole p99 of their heartbeats. Now what one call makes dies young
# (10,000 / 20 did no better for the beats; the RSS under the apply load was the same
# with either and with the defaults).
COLLECTOR_THRESHOLDS = (5_000, 10, 10)


# Seconds a shutdown step may take beyond its drain grace before it is left behind: a
# last resort, above the steps' own bounds (the agents' process is killed 15 s past the
# grace, a query cancelled within 10 s).
SHUTDOWN_STEP_SECONDS = 30.0


async def _bounded(what: str, step: Awaitable[object], grace: float = 0.0) -> None:
    """Await a shutdown step for at most its grace plus SHUTDOWN_STEP_SECONDS. One that
    takes longer (a task that does not answer its cancellation, a peer that does not
    close) is cancelled without waiting for it and logged in one line naming it."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=grace + SHUTDOWN_STEP_SECONDS)
    if task in done:
        if not task.cancelled() and task.exception() is not None:
            log.warning("shutdown: %s failed: %r", what, task.exception())
        return
    task.cancel()
    # Its outcome, whenever it comes, is nobody's to read: consumed here, not reported by
    # asyncio as never retrieved.
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    log.warning(
        "shutdown: %s did not finish within %g s; going on without it",
        what,
        grace + SHUTDOWN_STEP_SECONDS,
    )


def tune_collector() -> None:
    """Hide what start-up left alive from the cyclic garbage collector and set its
    thresholds (COLLECTOR_THRESHOLDS), for a process that serves until it ends (rm-server,
    not an in-process test server).

    Modules, descriptors, compiled handlers and pools, a few hundred thousand objects
    that live as long as the process, would otherwise be walked by every full
    collection. Under load gRPC leaves short-lived reference cycles behind on each call,
    so full collections come every couple of seconds, and each one stopped every call
    in flight for 20-40 ms (5000 agents beating, docs/benchmarks.md); frozen, one takes
    well under a millisecond. Objects made later are collected as usual."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def user_receive_limit(settings: Settings) -> int:
    """The largest message gRPC receives on `listen`: a user's request
    (`user_max_message_bytes`) when agents have a listener of their own, else an
    agent's (`max_message_bytes`: the one listener serves them too)."""
    largest = settings.max_message_bytes
    user = settings.user_max_message_bytes
    return min(user, largest) if settings.agent_listen and user > 0 else largest


def _grpc_server(settings: Settings, receive_limit: int) -> grpc.aio.Server:
    return grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", receive_limit),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
            # gRPC core starts cancelling calls at random once more than 1000 have
            # arrived that the server has not picked up yet (3000: all of them); a
            # few thousand agents beating at once pass that in a burst, and each
            # cancelled beat comes back 0.5 s later. Queue them instead.
            ("grpc.server.max_pending_requests", PENDING_RPCS_SOFT_LIMIT),
            ("grpc.server.max_pending_requests_hard_limit", PENDING_RPCS_HARD_LIMIT),
        ],
    )


class Role(enum.Enum):
    """What one rm-server process serves (architecture.md, "Which work runs where")."""

    ALL = "all"  # everything: one process
    USERS = "users"  # `listen` and the users' work; agents are served by a child process
    AGENTS = "agents"  # that child: `agent_listen` and the liveness judge


@dataclass
class RMServer:
    """One RM process (or an in-process RM for tests). With `agent_listen` and
    `agent_process`, the process started serves the users and starts the agents'
    process (rm_server.agent_process), an RMServer of role AGENTS."""

    settings: Settings
    role: Role = Role.ALL
    clock: Clock = field(default_factory=SystemClock)
    new_id: IdFactory = random_ids
    port: int = 0
    agent_port: int = 0  # agent_listen's port (0: agents use `port`)
    security: Security | None = None
    core: RMCore | None = None
    engine_conns: EngineConnManager | None = None
    hub: AgentHub | None = None
    demands: DemandManager | None = None
    _liveness: list[asyncio.Task[None]] = field(default_factory=list)  # the judge, the hearing
    _server: grpc.aio.Server | None = None  # serves `listen`
    _serving = False  # the gRPC server started (only then can it be stopped)
    _agent_server: grpc.aio.Server | None = None  # serves `agent_listen`, when set
    _agent_serving = False
    _health: health.aio.HealthServicer | None = None
    _embedded: EmbeddedPostgres | None = None
    _db: Database | None = None
    _notifier: LabelNotifier | None = None
    metrics: Metrics | None = None
    _metrics_http: MetricsHttpServer | None = None
    console: Console | None = None
    _agents: AgentProcess | None = None  # the agents' process (role USERS)

    async def start(self) -> None:
        """Start everything; should a part fail (a port taken, the database away), what
        already started is stopped again before the error propagates."""
        try:
            await self._start()
        except BaseException:
            await self.stop(grace=0)
            raise

    async def _start(self) -> None:
        # Before anything starts: an unsafe or broken security set-up refuses to run.
        self.security = build_security(self.settings)
        st = self.settings
        if self.role is Role.ALL and st.agent_listen and st.agent_process:
            self.role = Role.USERS  # agent_listen is served by a process of its own
        url = await self._open_database()
        self.metrics = Metrics(label_cap=st.metrics_label_cap)
        lease = await self._build_core()
        # One gRPC server per listener: gRPC's receive limit is a server's, and the users'
        # listener takes user-sized requests only (a larger one is dropped by gRPC itself,
        # before a byte of it reaches Python), while agents' heartbeats may be large.
        if self.role is not Role.AGENTS:
            self._server = _grpc_server(st, user_receive_limit(st))
        if st.agent_listen and self.role is not Role.USERS:
            self._agent_server = _grpc_server(st, st.max_message_bytes)
        calls = self._services()
        await self._start_jobs(lease)
        # This process's addresses are bound before the agents' process starts: the ports
        # it takes from the system (agent_listen :0, its metrics) cannot be one of ours.
        self._bind(calls)
        if st.metrics_listen:
            tls, authorize = self.security.metrics_guard()
            self._metrics_http = MetricsHttpServer(
                self.metrics, st.metrics_listen, tls=tls, authorize=authorize
            )
            await self._metrics_http.start()
        if st.console_listen and self.role is not Role.AGENTS:
            assert self.core and self.hub and self.engine_conns and self.demands and self._db
            sources = Sources(
                self.core, self.hub, self.engine_conns, self.demands, self.security,
                self.security.interceptor(DbOwners(self._db)),
            )  # fmt: skip
            self.console = Console(sources, st.console_listen)
            await self.console.start()
            self.metrics.attach_console(self.console.cache)
        if self.role is Role.USERS:  # serving agents before this process reports SERVING
            self._agents = AgentProcess(child_settings(st, url))
            await self._agents.start()
            self.agent_port = self._agents.port
            self.metrics.add_peer(self._agents.fetch_metrics)
        await self._serve()
        log.info("security: %s", self.security.describe(self.agent_port))

    async def _open_database(self) -> str:
        """The database (the embedded one, started here, without a URL); its URL."""
        st = self.settings
        url = st.database_url
        if not url:
            self._embedded = EmbeddedPostgres(st.data_dir)
            starting = asyncio.ensure_future(asyncio.to_thread(self._embedded.start))
            try:
                url = await asyncio.shield(starting)
            except asyncio.CancelledError:
                # A start cut short (a stop signal) cannot stop its thread halfway: it
                # runs to its end, and what it started is then stopped with the rest.
                with contextlib.suppress(Exception):
                    await starting
                raise
        self._db = Database(
            url,
            min_size=st.pool_min,
            max_size=st.pool_max,
            timeout=st.statement_timeout,
            slow_timeout=st.report_timeout,
        )
        await self._db.migrate()
        await self._db.open()
        self._notifier = LabelNotifier(self._db.connect)
        await self._notifier.start()
        return url

    async def _build_core(self) -> Lease:
        """The core, the EngineConn manager, the agents' hub and the demand manager; this
        replica joined. Returns the lease its background jobs run under."""
        st, db, metrics = self.settings, self._db, self.metrics
        assert db is not None and self._notifier is not None and metrics is not None
        assert self.security is not None
        core_settings = CoreSettings(
            lock_timeout=timedelta(seconds=st.lock_timeout),
            sweep_interval=st.sweep_interval,
            rules=parse_rules(st.label_rules),
            batch_max=st.batch_max,
            batch_inflight=st.batch_inflight,
            heartbeat_linger=st.heartbeat_linger,
            history_retention=timedelta(days=st.history_retention_days),
            request_id_retention=timedelta(hours=st.request_id_retention_hours),
            node_include_required=st.node_include_required,
            waiter_hold=timedelta(seconds=st.waiter_hold),
            usage_interval=st.usage_interval,
        )
        external = ExternalResources(db, self.clock, SecretSource(st.provider_secrets_dir))
        self.core = RMCore(
            db,
            self._notifier,
            core_settings,
            self.clock,
            self.new_id,
            external=external,
            on_reclaimed=metrics.count_reclaims,
            on_rolled=metrics.count_usage,
        )
        self.engine_conns = EngineConnManager(
            self.core, self._ec_settings(), self.security.ec_credentials
        )
        self.hub = AgentHub(self.engine_conns)
        self.demands = DemandManager(
            db, self._notifier, self.clock, self.core, self._demand_settings()
        )
        if self.role is not Role.AGENTS:  # the users' process reports these figures
            metrics.attach(self.core.capacity)
            metrics.attach_external(external)
            metrics.attach_states(self.hub)
            metrics.attach_liveness(self.hub)  # read from the database: the shared state
        await self.core.replicas.join()
        # Each background job runs on the one replica that holds its lease (app/background.py).
        return Lease(
            db,
            self.core.replica_id,
            self.clock,
            ttl=timedelta(seconds=max(5.0, 3 * st.sweep_interval)),
        )

    async def _start_jobs(self, lease: Lease) -> None:
        """The background jobs of this process's role (architecture.md, "Which work runs
        where"): the liveness judge where the agents are heard, the user's work (ticket
        sweep, demand planner) where the users are."""
        assert self.core and self.hub and self.demands and self.metrics
        observe = self.metrics.observe_pass
        if self.role is not Role.USERS:
            # Silence before this start proves nothing (the RM was away): marked before
            # the judge's first pass. Then every process that hears agents proves each
            # interval that it hears (the users' process hears none: its stalls cost no
            # agent a beat, and do not move the mark).
            await self.hub.judge.hearing.start(self.core.replica_id)
        self.core.start_background(lease, observe, ticket_sweep=self.role is not Role.AGENTS)
        if self.role is not Role.USERS:  # the judge, and the hearing it trusts, hear here
            interval = self.settings.sweep_interval
            self._liveness = [
                asyncio.create_task(
                    run_periodically("liveness", interval, self.hub.sweep, lease, observe),
                    name="liveness",
                ),
                asyncio.create_task(
                    run_periodically("hearing", interval, self.hub.judge.hearing.check),
                    name="hearing",
                ),
            ]
        if self.role is not Role.AGENTS:
            self.demands.planning.start_background(lease, observe)

    def _services(self) -> Interceptor:
        """Every service, added to the interceptor, which wraps each method once with
        logs, metrics, security and error statuses (its module doc)."""
        assert self.security and self.core and self.hub and self.engine_conns and self.demands
        assert self._db is not None
        calls = Interceptor(
            auth=self.security.interceptor(DbOwners(self._db)),
            metrics=self.metrics,
            limits=self.security.limits,
            user_max_message_bytes=self.settings.user_max_message_bytes,
        )
        resource_manager_pb2_grpc.add_ResourceManagerServiceServicer_to_server(
            ResourceManagerServicer(self.core, self.hub), calls
        )
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(self.core, self.hub, self.settings.database_url), calls
        )
        engine_conn_pb2_grpc.add_EngineConnServiceServicer_to_server(
            EngineConnServicer(self.engine_conns, self.hub), calls
        )
        demand_pb2_grpc.add_DemandServiceServicer_to_server(DemandServicer(self.demands), calls)
        usage_pb2_grpc.add_UsageServiceServicer_to_server(UsageServicer(self.core), calls)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, calls)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            reflection.aio.ReflectionServicer(
                (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME)
            ),
            calls,
        )
        return calls

    def _bind(self, calls: Interceptor) -> None:
        """Install the services and bind this process's gRPC listeners (gRPC binds a port
        when it is added; calls are served from `_serve`)."""
        assert self.security is not None
        if self._server is not None:
            calls.install(self._server)
            self.port = self.security.add_user_port(self._server)
        if self._agent_server is not None:
            calls.install(self._agent_server)
            self.agent_port = self.security.add_agent_port(self._agent_server)

    async def _serve(self) -> None:
        """Serve on the bound listeners, then report SERVING."""
        assert self._health is not None
        if self._server is not None:
            await self._server.start()
            self._serving = True
            log.info("rm-server listening on %s (port %d)", self.settings.listen, self.port)
        if self._agent_server is not None:
            await self._agent_server.start()
            self._agent_serving = True
            log.info("agents served on %s (port %d)", self.settings.agent_listen, self.agent_port)
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    @property
    def metrics_port(self) -> int:
        """The port of the metrics endpoint (0 when it is off)."""
        return self._metrics_http.port if self._metrics_http is not None else 0

    @property
    def database_files(self) -> Path | None:
        """Where the embedded database's files are (None: an external database)."""
        return self._embedded.pgdata if self._embedded is not None else None

    def _ec_settings(self) -> EcSettings:
        st = self.settings
        return EcSettings(
            create_timeout=st.create_timeout,
            max_launch_attempts=st.max_launch_attempts,
            ecm_expiry=timedelta(seconds=st.ecm_expiry),
            ec_expiry=timedelta(seconds=st.ec_expiry),
            agent_heartbeat_interval=st.agent_heartbeat_interval,
            ec_heartbeat_interval=st.ec_heartbeat_interval,
            kill_grace=st.kill_grace,
            node_include_required=st.node_include_required,
            disruption_share=st.disruption_share,
            disruption_min_agents=st.disruption_min_agents,
        )

    def _demand_settings(self) -> DemandSettings:
        st = self.settings
        planner = PlannerSettings(
            round_length=timedelta(seconds=st.demand_interval),
            lead_time=timedelta(seconds=st.demand_lead_time),
            claim_timeout=timedelta(seconds=st.demand_claim_timeout),
            loose_slip=timedelta(seconds=st.demand_loose_slip),
            default_duration=timedelta(seconds=st.demand_default_duration),
            order_by_timeout=timedelta(seconds=st.demand_order_by_timeout),
            commit_margin=timedelta(seconds=min(st.demand_commit_margin, st.demand_interval / 2)),
        )
        return DemandSettings(planner=planner, interval=st.demand_interval)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful stop: health NOT_SERVING, finish in-flight calls, then close. Each step
        is bounded (`shutdown_step`): one that does not finish is logged by name and left
        behind, and the rest still run; a drain never hangs the process."""
        grace = self.settings.shutdown_grace if grace is None else grace
        if self._health is not None:
            await _bounded("health", self._health.enter_graceful_shutdown())
        if self._metrics_http is not None:
            await _bounded("the metrics endpoint", self._metrics_http.stop())
        if self.console is not None:
            await _bounded("the console", self.console.stop())
        # The judge goes first: a server that drains takes no new calls, so from here on
        # it cannot hear agents and EngineConns, and must not hold their silence against
        # them (another replica, or this one restarted, takes over under the lease).
        for task in self._liveness:
            task.cancel()
        await _bounded(
            "the liveness judge", asyncio.gather(*self._liveness, return_exceptions=True)
        )
        if self.hub is not None:
            self.hub.judge.hearing.close()
        serving = [self._server] if self._serving else []
        serving += [self._agent_server] if self._agent_serving else []
        stopping = [server.stop(grace) for server in serving if server is not None]
        if self._agents is not None:
            stopping.append(self._agents.stop(grace))
        await _bounded("the listeners' drain", asyncio.gather(*stopping), grace)
        if self.demands is not None:
            await _bounded("the demand planner", self.demands.planning.stop_background())
        if self.core is not None:
            await _bounded("the background jobs", self.core.stop_background(grace), grace)
            if self.core.external is not None:
                await _bounded("the external providers", self.core.external.close())
        if self._notifier is not None:
            await _bounded("the LISTEN connection", self._notifier.stop())
        if self._db is not None:
            await _bounded("the database pool", self._db.close())
        if self._embedded is not None:
            await _bounded("the embedded PostgreSQL", asyncio.to_thread(self._embedded.stop))

    async def run_until_signalled(self) -> None:
        """Serve until SIGTERM or SIGINT, then drain (`stop`)."""
        signalled = asyncio.Event()
        with stop_signals(signalled.set):
            if not await start_unless_signalled(self, signalled):
                return
            tune_collector()
            await wait_for_signal(signalled)
            await self.stop()


async def start_unless_signalled(server: RMServer, signalled: asyncio.Event) -> bool:
    """`server.start()`, cut short by a stop signal meanwhile (a start can take long: the
    embedded database's first start, a database that does not answer); False then, with
    what had started stopped again (`RMServer.start`). Its error propagates."""
    starting = asyncio.ensure_future(server.start())
    heard = asyncio.ensure_future(signalled.wait())
    try:
        await asyncio.wait((starting, heard), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        starting.cancel()
        raise
    finally:
        heard.cancel()
    if starting.done():
        starting.result()
        return True
    log.info("signal received while starting: stopping")
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    return False


async def wait_for_signal(signalled: asyncio.Event) -> None:
    """Return once `signalled` is set by a stop signal (then the caller drains)."""
    await signalled.wait()
    log.info("signal received: draining")
