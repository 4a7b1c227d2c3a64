"""Database.run is bounded: a server that stops answering (a frozen primary: its kernel
still acknowledges every packet, so neither TCP keepalives nor tcp_user_timeout notice)
costs a caller at most the statement timeout, answered UNAVAILABLE; and a COMMIT that
PostgreSQL answers without the synchronous standby's confirmation (its wait cancelled)
is not acknowledged.
The failover test (test_failover.py) shows the same on a Patroni cluster."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from labelrm.v1 import resource_manager_pb2_grpc

from rm_server.errors import Unavailable
from rm_server.store.db import Conn, Database, connection_kwargs
from tests.support.database import start_embedded
from tests.support.env import shared_tmp
from tests.support.messages import GiB, apply_req, load_instance, register
from tests.support.waiting import wait_until_sync

HANG_GUARD = 60  # seconds: a call still running then hangs (the bug), it is no answer


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, min_size=1, max_size=1, attempts=2, timeout=1.0)
    await database.open()
    try:
        yield database
    finally:
        await database.close()


async def _backend_pid(conn: Conn) -> int:
    row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_frozen_server_costs_a_caller_the_bound_then_unavailable(db: Database) -> None:
    """The pool's one connection's backend is stopped (SIGSTOP, as a frozen primary's
    backends are): the next transaction on it is abandoned at the bound and answered
    UNAVAILABLE; once the backend runs again, a fresh connection serves the next call."""
    pid = await db.run(_backend_pid)
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(Unavailable) as refused:
            await asyncio.wait_for(db.run(_backend_pid), HANG_GUARD)
        assert str(refused.value) == "database did not answer within 1 s"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert await asyncio.wait_for(db.run(_backend_pid), HANG_GUARD) != pid


async def test_a_call_may_have_a_bound_of_its_own(db: Database) -> None:
    """`bound` sets both the client's deadline and the statements' statement_timeout of
    that one transaction (the bulk reads' report_timeout)."""

    async def timeout_setting(conn: Conn) -> str:
        row = await (await conn.execute("SHOW statement_timeout")).fetchone()
        assert row is not None
        return str(row[0])

    assert await db.run(timeout_setting) == "1s"
    assert await db.run(timeout_setting, bound=30) == "30s"


@pytest.mark.once
def test_every_connection_has_keepalives_and_timeouts() -> None:
    """What the URL says is kept (its options, its connect_timeout); the rest is added."""
    url = "postgresql://u@h1:5432,h2:5432/db?connect_timeout=2&options=-c%20work_mem%3D8MB"
    kwargs = connection_kwargs(url, 5.0)
    assert "connect_timeout" not in kwargs
    assert kwargs["keepalives"] == 1
    assert kwargs["tcp_user_timeout"] == 5000
    assert kwargs["options"] == (
        "-c work_mem=8MB -c statement_timeout=5000 -c idle_in_transaction_session_timeout=10000"
    )
    assert connection_kwargs("postgresql://u@h/db", 5.0)["connect_timeout"] == 5


@pytest.fixture(scope="module")
def waiting_for_a_standby() -> Iterator[str]:
    """A private PostgreSQL whose commits wait for a synchronous standby that never
    comes (synchronous_standby_names is server-wide: not on the shared test server)."""
    tmp = Path(tempfile.mkdtemp(prefix="labelrm-test-syncrep-"))
    server, url = start_embedded(tmp / "pgdata")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE sync_probe (k text PRIMARY KEY)")  # commits after wait
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby_never_there'")
            conn.execute("ALTER SYSTEM SET lc_messages = 'C'")
            conn.execute("SELECT pg_reload_conf()")
        yield url
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def _cancel_when_waiting_for_the_standby(url: str) -> None:
    """pg_cancel_backend (an operator's, or a driver's on a cancelled call) of the one
    backend whose COMMIT waits for the synchronous standby, once it does."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(HANG_GUARD * 20):
            row = conn.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).fetchone()
            if row is not None:
                return
            time.sleep(0.05)
    raise TimeoutError("no COMMIT waited for the synchronous standby")


@pytest.mark.once
@pytest.mark.parametrize("pipeline", [False, True], ids=["transaction", "pipeline"])
async def test_a_commit_the_standby_never_confirmed_is_not_acknowledged(
    waiting_for_a_standby: str, pipeline: bool
) -> None:
    """A COMMIT waiting for the synchronous standby that is cancelled answers success
    with a warning: committed on this server only, which a failover may lose.
    rm-server answers UNAVAILABLE instead; the caller retries with its request id."""
    db = Database(waiting_for_a_standby, min_size=1, max_size=1, attempts=1, timeout=HANG_GUARD)
    await db.open()
    key = f"k-{pipeline}"

    async def insert(conn: Conn) -> None:
        await conn.execute("INSERT INTO sync_probe (k) VALUES (%s)", (key,))

    try:
        commit = asyncio.ensure_future(db.run(insert, pipeline=pipeline))
        await asyncio.to_thread(_cancel_when_waiting_for_the_standby, waiting_for_a_standby)
        with pytest.raises(Unavailable) as refused:
            await asyncio.wait_for(commit, HANG_GUARD)
        assert str(refused.value) == "the commit was not confirmed by the synchronous standby"
    finally:
        await db.close()
    with psycopg.connect(waiting_for_a_standby) as conn:  # committed locally all the same
        assert conn.execute("SELECT k FROM sync_probe WHERE k = %s", (key,)).fetchall() == [(key,)]


OUTAGE_SECONDS = 4.0  # the database stays away this long (the old listener: ~20 lines)


@pytest.mark.once
def test_a_database_outage_is_logged_in_one_line_per_job_without_a_traceback(
    rm_process_factory: Any,
) -> None:
    """The database stops (a failover's moment without a primary) and comes back: the
    LISTEN loop backs off and says so once, with one line when it is back, the replica
    presence job says it in one line (it once logged a 38-line traceback at ERROR), and
    the server then serves again."""
    base = shared_tmp("lrm-outage-pg-")
    handle, url = start_embedded(base / "pgdata")
    try:
        server = rm_process_factory("--sweep-interval", "0.2", url=url)
        server.start()
        with grpc.insecure_channel(server.target) as channel:
            rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
            rm.RegisterEcm(register("outage:1", load_instance(GiB, 1000, 10)), timeout=10)
            handle.cleanup()
            time.sleep(OUTAGE_SECONDS)  # the outage's length is the test's input
            handle, again = start_embedded(base / "pgdata")
            assert again == url

            def serves() -> bool:
                try:
                    rm.Apply(apply_req("emInstance=outage:1", load_instance(1, 1, 1)), timeout=5)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    return False
                return True

            wait_until_sync(serves, 60, what="an Apply after the database came back")
        log = server.log_path.read_text()
        assert "Traceback" not in log
        assert "level=ERROR" not in log, [ln for ln in log.splitlines() if "ERROR" in ln][:3]
        assert log.count("notification listener lost its connection") == 1, log[-3000:]
        presence = [ln for ln in log.splitlines() if "background job replicas:" in ln]
        assert len(presence) <= 2, presence  # one when it goes, one when it is back
        wait_until_sync(
            lambda: "notification listener reconnected" in server.log_path.read_text(),
            30,
            what="the listener's reconnection line",
        )
    finally:
        handle.cleanup()
        shutil.rmtree(base, ignore_errors=True)
