"""EngineConns on a secured cluster: a real agent with its certificate on the mutual-TLS
listener, the RM issuing each EngineConn a certificate as launch material, the
EngineConn reporting with it, and users reaching only their own EngineConns."""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import subprocess
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from ecm_agent.validate import SECRET_FILE
from ecm_agent.workdir import LAUNCH_SCRIPT
from labelrm_client import AsyncRMClient, ExecOutput, ExecResult, Unauthenticated
from rm_server.security.ec_certs import CERT_FILE, KEY_FILE
from tests.integration.security_fixtures import secure_cluster, start_secure_agent
from tests.support.messages import lbl
from tests.support.waiting import wait_until

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"


@pytest.fixture
async def cluster(database_url, tmp_path, sudo_users):
    async with secure_cluster(database_url, tmp_path, sudo_users) as srm:
        yield srm


async def test_engineconn_reports_with_the_certificate_the_rm_issued(cluster, agent_factory):
    agent = await start_secure_agent(cluster, agent_factory)
    keys = cluster.pki
    admin = cluster.stubs(cluster.channel("root"))
    owner = cluster.stubs(cluster.channel("lrmtest_a"))
    other = cluster.stubs(cluster.channel("lrmtest_b"))
    request = ec_pb.CreateEngineConnRequest(
        request_id="secure-ec-1", labels=lbl(SHELL_A), timeout=Duration(seconds=30)
    )
    try:
        ec = (await owner.ecs.CreateEngineConn(request, timeout=60)).engine_conn
    except grpc.aio.AioRpcError as exc:  # pragma: no cover - diagnostics
        pytest.fail(f"{exc.code()}: {exc.details()}\nagent log:\n{agent.log_text()[-3000:]}")
    # Ready means its IDLE report got through: mutual TLS with the certificate for its id.
    assert ec.state == ec_pb.ENGINE_CONN_STATE_IDLE and ec.user == "lrmtest_a"
    uid = pwd.getpwnam("lrmtest_a").pw_uid
    for name in (CERT_FILE, KEY_FILE, SECRET_FILE):
        st = os.stat(Path(ec.work_dir) / name)
        assert st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o600, name
    # The executor's secret is in that file only: not in the launch script (root's, 0644:
    # readable by the members of the user's group), nor in any process's environment.
    assert (Path(ec.work_dir) / SECRET_FILE).read_text() == ec.secret
    assert ec.secret not in (Path(ec.work_dir) / LAUNCH_SCRIPT).read_text()
    assert _environs_holding(ec.secret.encode()) == []
    # Another user can neither see nor stop it (it does not exist for them); its owner can.
    for rpc, req in (
        (other.ecs.GetEngineConn, ec_pb.GetEngineConnRequest(engine_conn_id=ec.engine_conn_id)),
        (other.ecs.KillEngineConn, ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc(req)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    listed = (await other.ecs.ListEngineConns(ec_pb.ListEngineConnsRequest())).engine_conns
    assert listed == []
    # So only the owner (and admins) learn the executor's secret, which it requires.
    assert ec.secret
    get = ec_pb.GetEngineConnRequest(engine_conn_id=ec.engine_conn_id)
    assert (await owner.ecs.GetEngineConn(get)).engine_conn.secret == ec.secret
    assert (await admin.ecs.GetEngineConn(get)).engine_conn.secret == ec.secret
    for stubs in (owner, admin):
        mine = (await stubs.ecs.ListEngineConns(ec_pb.ListEngineConnsRequest())).engine_conns
        assert [e.engine_conn_id for e in mine] == [ec.engine_conn_id] and not mine[0].secret
    # Its owner cannot end its ticket under it either: the EngineConn's lifecycle owns it.
    for rpc, ticket_req in (
        (owner.rm.Release, pb.ReleaseRequest(ticket_id=ec.ticket_id)),
        (owner.rm.ReportUsed, pb.ReportUsedRequest(ticket_id=ec.ticket_id)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc(ticket_req)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "KillEngineConn" in (err.value.details() or "")
    ticket = (await admin.rm.GetTicket(pb.GetTicketRequest(ticket_id=ec.ticket_id))).ticket
    assert ticket.state == pb.TICKET_STATE_USED
    async with AsyncRMClient(
        cluster.user_target, token=keys.tokens["lrmtest_a"], tls_ca=keys.ca
    ) as sdk:
        items = [item async for item in sdk.execute(ec, "id -un")]
        assert items == [ExecOutput("stdout", "lrmtest_a\n"), ExecResult(0, False, "")]
        with pytest.raises(Unauthenticated):
            async for _ in sdk.execute(ec.address, "id -un"):
                pass
    await owner.ecs.KillEngineConn(ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id))

    async def ended() -> bool:
        got = await owner.ecs.GetEngineConn(
            ec_pb.GetEngineConnRequest(engine_conn_id=ec.engine_conn_id)
        )
        return bool(got.engine_conn.state == ec_pb.ENGINE_CONN_STATE_SUCCEEDED)

    await wait_until(ended, timeout=30)


# Local user B's client: 500 Execute calls to an EngineConn's port without its secret.
FLOOD = """
import sys, grpc
from labelrm.v1 import executor_pb2, executor_pb2_grpc
refused = 0
with grpc.insecure_channel(sys.argv[1]) as channel:
    stub = executor_pb2_grpc.ExecutorServiceStub(channel)
    for _ in range(500):
        try:
            list(stub.Execute(executor_pb2.ExecuteRequest(code="id"), timeout=10))
        except grpc.RpcError as exc:
            refused += exc.code() == grpc.StatusCode.UNAUTHENTICATED
print(refused)
"""


async def test_a_local_user_cannot_fill_an_engineconns_log(cluster, agent_factory, ec_python):
    """Local user B calls user A's EngineConn port 500 times without its secret: every
    call is refused, and A's stderr.log gets one line at once and one with the count
    of the rest, not 500 lines."""
    await start_secure_agent(cluster, agent_factory)
    owner = cluster.stubs(cluster.channel("lrmtest_a"))
    request = ec_pb.CreateEngineConnRequest(labels=lbl(SHELL_A), timeout=Duration(seconds=30))
    ec = (await owner.ecs.CreateEngineConn(request, timeout=60)).engine_conn
    stderr = Path(ec.work_dir) / "logs" / "stderr.log"
    before = stderr.stat().st_size
    flood = await asyncio.to_thread(
        subprocess.run,
        ["sudo", "-n", "-u", "lrmtest_b", "--", ec_python, "-c", FLOOD, ec.address],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert flood.returncode == 0 and flood.stdout.split() == ["500"], flood.stderr[-2000:]

    def refusals() -> list[str]:
        with stderr.open("rb") as log:
            log.seek(before)
            return [line for line in log.read().decode().splitlines() if "refused" in line]

    first = refusals()
    assert len(first) == 1 and "no authorization" in first[0], first
    assert sum(len(line) + 1 for line in first) < 300
    # The rest are counted, and written when the interval ends or, here, as it stops.
    await owner.ecs.KillEngineConn(ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id))
    await wait_until(lambda: len(refusals()) >= 2, timeout=30)
    lines = refusals()
    assert len(lines) == 2, lines
    assert "refused 499 more calls from ipv4:127.0.0.1 (no authorization: 499)" in lines[1]


def _environs_holding(secret: bytes) -> list[Path]:
    """The /proc/PID/environ files that contain `secret` (processes gone meanwhile skipped)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if secret in environ.read_bytes():
                found.append(environ)
        except OSError:
            continue
    return found
