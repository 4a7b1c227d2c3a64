"""Assembles and runs the RM: database, notifier, core, gRPC server with the
error interceptor, reflection and the standard health service."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from datetime import timedelta

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2, resource_manager_pb2_grpc

from rm_server.clock import Clock, IdFactory, SystemClock, random_ids
from rm_server.config import Settings
from rm_server.core import CoreSettings, RMCore
from rm_server.domain.labels import parse_rules
from rm_server.embedded import EmbeddedPostgres
from rm_server.service.admin import AdminServicer
from rm_server.service.errors import ErrorInterceptor
from rm_server.service.resource_manager import ResourceManagerServicer
from rm_server.store import Database, LabelNotifier

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    resource_manager_pb2.DESCRIPTOR.services_by_name["ResourceManagerService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
)


@dataclass
class RMServer:
    """One RM process (or an in-process RM for tests)."""

    settings: Settings
    clock: Clock = field(default_factory=SystemClock)
    new_id: IdFactory = random_ids
    port: int = 0
    core: RMCore | None = None
    _server: grpc.aio.Server | None = None
    _health: health.aio.HealthServicer | None = None
    _embedded: EmbeddedPostgres | None = None
    _db: Database | None = None
    _notifier: LabelNotifier | None = None

    async def start(self) -> None:
        url = self.settings.database_url
        if not url:
            self._embedded = EmbeddedPostgres(self.settings.data_dir)
            url = await asyncio.to_thread(self._embedded.start)
        self._db = Database(url, min_size=self.settings.pool_min, max_size=self.settings.pool_max)
        await self._db.migrate()
        await self._db.open()
        self._notifier = LabelNotifier(url)
        await self._notifier.start()
        core_settings = CoreSettings(
            lock_timeout=timedelta(seconds=self.settings.lock_timeout),
            sweep_interval=self.settings.sweep_interval,
            rules=parse_rules(self.settings.label_rules),
        )
        self.core = RMCore(self._db, self._notifier, core_settings, self.clock, self.new_id)
        self.core.start_background()

        limit = self.settings.max_message_bytes
        self._server = grpc.aio.server(
            interceptors=[ErrorInterceptor()],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ],
        )
        resource_manager_pb2_grpc.add_ResourceManagerServiceServicer_to_server(
            ResourceManagerServicer(self.core), self._server
        )
        admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(self.core), self._server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        self.port = self._server.add_insecure_port(self.settings.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.settings.listen}")
        await self._server.start()
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("rm-server listening on %s (port %d)", self.settings.listen, self.port)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful stop: health NOT_SERVING, finish in-flight calls, then close."""
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace if grace is None else grace)
        if self.core is not None:
            await self.core.stop_background()
        if self._notifier is not None:
            await self._notifier.stop()
        if self._db is not None:
            await self._db.close()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)

    async def run_until_signalled(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("signal received: draining")
        await self.stop()
