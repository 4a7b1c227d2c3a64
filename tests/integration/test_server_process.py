"""rm-server as an operator runs it: embedded database, SIGTERM, replicas starting
together, and a multi-host database URL."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import admin_pb2, admin_pb2_grpc, engine_conn_pb2_grpc, resource_manager_pb2_grpc
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.serving import free_port
from tests.support.env import ROOT, shared_tmp
from tests.support.messages import GiB, apply_req, lbl, load, load_instance, register
from tests.support.rm import assert_consistent, start_in_process, stop_in_process
from tests.support.waiting import log_tail, wait_serving, wait_until_sync


@pytest.fixture
def reachable_tmp() -> Iterator[Path]:
    """A directory the embedded database's own OS user can reach: run by root, the
    database runs as another user, and pytest's tmp_path sits in a 0700 directory."""
    path = shared_tmp("lrm-data-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def postgres_processes_for(pgdata) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(str(pgdata) in part for part in cmdline) and "postgres" in " ".join(cmdline):
            found.append(proc)
    return found


def test_embedded_database_and_graceful_sigterm(tmp_path, reachable_tmp):
    port = free_port()
    data_dir = reachable_tmp / "data"
    log = (tmp_path / "rm.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rm_server",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(data_dir),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        wait_serving(f"127.0.0.1:{port}", 60)
        assert (data_dir / "pgdata" / "PG_VERSION").exists()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
            stub.RegisterEcm(register("h:1", load_instance(GiB, 1000, 1)), timeout=10)
            ticket = stub.Apply(apply_req("emInstance=h:1", load(1, 1)), timeout=10).ticket
            assert ticket.state == pb.TICKET_STATE_LOCKED
        assert postgres_processes_for(data_dir / "pgdata")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        text = (tmp_path / "rm.log").read_text()
        assert "draining" in text
        wait_until_sync(
            lambda: not postgres_processes_for(data_dir / "pgdata"),
            20,
            what="the embedded server stopped",
        )
    finally:
        if proc.poll() is None:
            proc.kill()


def test_two_replicas_starting_together_migrate_once(rm_process_factory, database_url):
    first, second = rm_process_factory(), rm_process_factory()
    errors: list[BaseException] = []

    def start(p):
        try:
            p.start()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(p,)) for p in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert errors == []
    import psycopg

    with psycopg.connect(database_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migration")]
    shipped = sorted(p.stem for p in (ROOT / "rm_server/store/migrations").glob("*.sql"))
    assert sorted(versions) == shipped  # each exactly once (it is the primary key)


async def test_multi_host_url_with_target_session_attrs(database_url):
    parts = conninfo_to_dict(database_url)
    host = parts.get("host") or "127.0.0.1"
    port = str(parts.get("port") or 5432)
    # The first host refuses connections; libpq must go on to the second.
    url = make_conninfo(
        database_url,
        host=f"127.0.0.1,{host}",
        port=f"1,{port}",
        target_session_attrs="read-write",
    )
    rm = await start_in_process(url)
    try:
        await rm.rm.RegisterEcm(register("h:1", load_instance(GiB, 1000, 1)))
        resp = await rm.rm.Apply(apply_req("emInstance=h:1", load(1, 1)))
        assert resp.ticket.state == pb.TICKET_STATE_LOCKED
        await assert_consistent(rm)
    finally:
        await stop_in_process(rm)


def test_rmctl_dev_starts_rm_and_local_agent(tmp_path, reachable_tmp):
    """`rmctl dev` = RM on the embedded database + one local agent, in the foreground."""
    port = free_port()
    env = dict(os.environ, LABELRM_DEV_USERS="lrmtest_a")
    log = (tmp_path / "dev.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from rmctl import main; raise SystemExit(main())",
            "dev",
            "--data-dir",
            str(reachable_tmp / "data"),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=env,
    )
    try:
        wait_serving(f"127.0.0.1:{port}", 60)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
            wait_until_sync(
                lambda: (
                    "local-agent"
                    in [e.instance for e in stub.ListEcms(pb.ListEcmsRequest(), timeout=5).ecms]
                ),
                30,
                what=lambda: "local-agent registered\n" + log_tail(tmp_path / "dev.log", 2000),
            )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def _agent_running(stub, agent_id: str) -> bool:
    try:
        ecm = stub.GetEcm(pb.GetEcmRequest(instance=agent_id), timeout=5).ecm
    except grpc.RpcError:
        return False
    return bool(ecm.state == pb.ECM_STATE_RUNNING and ecm.HasField("last_heartbeat_time"))


def test_agent_stopping_right_after_a_kill_never_crashes_the_server(
    rm_process_factory, agent_factory
):
    """Create an EngineConn, kill it, and at once stop the agent, many times over: the
    kill command is on its way down the agent's command stream as the agent goes away.
    The server once died of a segmentation fault there (within 1 to 12 rounds)."""
    server = rm_process_factory()
    server.start()
    assert server.proc is not None
    with grpc.insecure_channel(server.target) as channel:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        ecs = engine_conn_pb2_grpc.EngineConnServiceStub(channel)
        for round_ in range(30):
            agent = agent_factory(server.target, "agent1")
            agent.start()
            wait_until_sync(
                lambda: _agent_running(rm, "agent1"),
                30,
                what=functools.partial(log_tail, agent.log_path, 2000),
                interval=0.05,
            )
            request = ec_pb.CreateEngineConnRequest(
                user="lrmtest_a",
                labels=lbl("userCreator=lrmtest_a-IDE,engineType=shell-1"),
                timeout=Duration(seconds=30),
            )
            ec = ecs.CreateEngineConn(request, timeout=60).engine_conn
            ecs.KillEngineConn(
                ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id), timeout=10
            )
            assert agent.proc is not None
            agent.proc.send_signal(signal.SIGTERM)
            agent.proc.wait(30)
            assert server.proc.poll() is None, (
                f"rm-server died (exit {server.proc.returncode}) in round {round_}:\n"
                + server.log_path.read_text()[-3000:]
            )
        report = admin_pb2_grpc.AdminServiceStub(channel).CheckConsistency(
            admin_pb2.CheckConsistencyRequest(), timeout=30
        )
        assert report.consistent, [str(m) for m in report.mismatches]
    assert server.proc.poll() is None


def test_sigterm_ends_the_process_while_a_request_waits_on_a_lock(rm_process_factory, database_url):
    """A grouped request whose statement waits on a row another session holds does not
    keep rm-server from stopping: past the grace, the drain cancels it (its transaction
    rolls back; the caller retries with its request id). It used to wait for the other
    session, however long."""
    import psycopg

    rm = rm_process_factory("--shutdown-grace=1", "--batch-max=256")
    rm.start()
    with grpc.insecure_channel(rm.target) as channel:
        stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        stub.RegisterEcm(register("held:1", load_instance(GiB, 1000, 10)), timeout=30)
        with psycopg.connect(database_url) as holder:
            locked = holder.execute(
                "SELECT label FROM label_resource WHERE label LIKE 'emInstance=held:1%' FOR UPDATE"
            ).fetchall()
            assert len(locked) == 1, locked
            with pytest.raises(grpc.RpcError) as waited:
                stub.Apply(apply_req("emInstance=held:1", load_instance(1, 1, 1)), timeout=2)
            assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert rm.proc is not None
            rm.proc.send_signal(signal.SIGTERM)
            try:
                code = rm.proc.wait(60)  # the lock is still held all the while
            except subprocess.TimeoutExpired:
                pytest.fail(f"rm-server still running 60 s after SIGTERM:\n{log_tail(rm.log_path)}")
            holder.rollback()
    assert code == 0, log_tail(rm.log_path)
    with psycopg.connect(database_url) as conn:  # the cancelled Apply left nothing
        assert conn.execute("SELECT count(*) FROM ticket").fetchone() == (0,)


RM_SERVER = (sys.executable, "-m", "rm_server", "--listen", "127.0.0.1:0")


def test_a_stop_signal_during_the_embedded_databases_first_start(tmp_path, reachable_tmp):
    """Ctrl-C while the embedded database is being created (initdb, its first start):
    the start cannot be cut halfway, so it runs to its end and is stopped with the rest.
    Exit 0, and no PostgreSQL left running for the data directory."""
    data_dir = reachable_tmp / "data"
    log = tmp_path / "rm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*RM_SERVER, "--data-dir", str(data_dir), "--log-level", "INFO"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        wait_until_sync(data_dir.exists, 60, what="the start under way")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = log.read_text()
    assert "signal received while starting" in said, said
    assert "Traceback" not in said, said
    wait_until_sync(
        lambda: not postgres_processes_for(data_dir / "pgdata"),
        20,
        what="no embedded PostgreSQL left running",
    )
