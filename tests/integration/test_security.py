"""Security end to end on a real server: TLS, client certificates, tokens, the role x
RPC matrix, ownership, limits, and the refusal to serve unsafely."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc
import pytest
from google.protobuf import message_factory
from labelrm.v1 import (
    admin_pb2,
    demand_pb2,
    engine_conn_pb2,
    resource_manager_pb2,
    resource_manager_pb2_grpc,
)
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from bench.serving import free_port
from rm_server.domain.engineconn import EcState, EngineConn
from rm_server.domain.resources import Resource
from rm_server.security.limits import RATE_LIMITED, TOO_MANY_WAITING
from rm_server.store import engineconns as ec_store
from rm_server.store.db import Idempotency
from tests.integration.security_fixtures import Pki, make_pki, start_secure, stop_secure
from tests.support.env import ROOT
from tests.support.messages import GiB, apply_req, lbl, load, load_instance, register
from tests.support.refusals import reason_of
from tests.support.rm import beat_on_stream
from tests.support.waiting import wait_until

ALICE_LABELS = "userCreator=alice-IDE,engineType=spark-3.2.1"
BOB_LABELS = "userCreator=bob-IDE,engineType=spark-3.2.1"
DENIED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)

SERVICES = [
    resource_manager_pb2.DESCRIPTOR.services_by_name["ResourceManagerService"],
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
    engine_conn_pb2.DESCRIPTOR.services_by_name["EngineConnService"],
    demand_pb2.DESCRIPTOR.services_by_name["DemandService"],
]
# Who may call what, written out independently of rm_server/security/policy.py (admins
# may call everything and are not listed). A new RPC without a line here fails the test.
EXPECTED = {
    "ResourceManagerService/RegisterEcm": {"agent", "agent_token"},
    "ResourceManagerService/UnregisterEcm": {"agent", "agent_token"},
    "ResourceManagerService/Heartbeat": {"agent", "agent_token"},
    "ResourceManagerService/HeartbeatStream": {"agent", "agent_token"},
    "ResourceManagerService/Apply": {"user"},
    "ResourceManagerService/ReportUsed": {"user"},
    "ResourceManagerService/Release": {"user"},
    "ResourceManagerService/GetTicket": {"user"},
    "ResourceManagerService/ListTickets": {"user"},
    "ResourceManagerService/GetLabelResource": {"user"},
    "ResourceManagerService/ListLabelResources": {"user"},
    "ResourceManagerService/GetEcm": {"user"},
    "ResourceManagerService/ListEcms": {"user"},
    "AdminService/SetLabelLimit": set(),
    "AdminService/ListLabelLimits": set(),
    "AdminService/DeleteLabelLimit": set(),
    "AdminService/CheckConsistency": set(),
    "AdminService/RefreshNodes": set(),
    "AdminService/DecommissionEcm": set(),
    "AdminService/CordonEcm": set(),
    "AdminService/UncordonEcm": set(),
    "AdminService/GetClusterInfo": set(),
    "AdminService/ListEvents": set(),
    "AdminService/PutExternalProvider": set(),
    "AdminService/ListExternalProviders": set(),
    "AdminService/DeleteExternalProvider": set(),
    "AdminService/TestExternalProvider": set(),
    "EngineConnService/CreateEngineConn": {"user"},
    "EngineConnService/AskEngineConn": {"user"},
    "EngineConnService/GetEngineConn": {"user"},
    "EngineConnService/ListEngineConns": {"user"},
    "EngineConnService/KillEngineConn": {"user"},
    "EngineConnService/StreamAgentCommands": {"agent", "agent_token"},
    "EngineConnService/ReportEngineConnState": {"engineconn"},
    "DemandService/SubmitDemand": {"user"},
    "DemandService/GetDemand": {"user"},
    "DemandService/ListDemands": {"user"},
    "DemandService/CancelDemand": {"user"},
    "DemandService/ClaimDemand": {"user"},
}
ROLES = ("anonymous", "user", "admin", "agent", "agent_token", "engineconn")
# Fields every role's request carries: the agent's and the EngineConn's own ids (so an
# allowed call passes the ownership checks) and unknown object ids.
FIELDS = {
    "instance": "agent1",
    "agent_id": "agent1",
    "engine_conn_id": "ec-matrix",
    "ticket_id": "t-unknown",
    "demand_id": "d-unknown",
}


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("security-pki"))


@pytest.fixture
async def srm(database_url, keys):
    rm = await start_secure(database_url, keys)
    try:
        yield rm
    finally:
        await stop_secure(rm)


def role_channel(srm, role: str):
    keys = srm.pki
    return {
        "anonymous": lambda: srm.channel(),
        "user": lambda: srm.channel("alice"),
        "admin": lambda: srm.channel("root"),
        "agent": lambda: srm.channel(cert=keys.cert("agent", "agent1"), agent_port=True),
        "agent_token": lambda: srm.channel("agent1"),
        "engineconn": lambda: srm.channel(
            cert=keys.cert("engineconn", "ec-matrix"), agent_port=True
        ),
    }[role]()


async def call(channel, service, method, request_id: str) -> grpc.StatusCode:
    """Call any RPC with a minimal request; the status code it ends with."""
    request = message_factory.GetMessageClass(method.input_type)()
    for name, value in FIELDS.items():
        if name in method.input_type.fields_by_name:
            setattr(request, name, value)
    if method.client_streaming:  # HeartbeatStream: the ids sit in the wrapped message
        for field in method.input_type.fields:
            if field.message_type is not None:
                for name, value in FIELDS.items():
                    if name in field.message_type.fields_by_name:
                        setattr(getattr(request, field.name), name, value)
    if "request_id" in method.input_type.fields_by_name:
        # A message class built at run time from its descriptor: no attributes known statically.
        request.request_id = request_id  # type: ignore[attr-defined]
    response_type = message_factory.GetMessageClass(method.output_type)
    path = f"/{service.full_name}/{method.name}"
    kwargs = {
        "request_serializer": type(request).SerializeToString,
        "response_deserializer": response_type.FromString,
    }
    try:
        if method.client_streaming:
            stream = channel.stream_stream(path, **kwargs)(timeout=5.0)
            await stream.write(request)
            await stream.done_writing()
            async for _ in stream:
                break
        elif method.server_streaming:
            stream = channel.unary_stream(path, **kwargs)(request, timeout=1.0)
            async for _ in stream:
                break
        else:
            await channel.unary_unary(path, **kwargs)(request, timeout=10)
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def test_role_rpc_matrix(srm):
    methods = [(s, m) for s in SERVICES for m in s.methods]
    names = {f"{s.name}/{m.name}" for s, m in methods}
    assert names == set(EXPECTED), "every RPC needs a line in EXPECTED (and policy.POLICY)"
    failures = []
    for role in ROLES:
        channel = role_channel(srm, role)
        for service, method in methods:
            name = f"{service.name}/{method.name}"
            code = await call(channel, service, method, f"matrix-{role}-{method.name}")
            allowed = role == "admin" or role in EXPECTED[name]
            if allowed and code in DENIED:
                failures.append(f"{role} {name}: expected allowed, got {code.name}")
            if not allowed:
                want = (
                    grpc.StatusCode.UNAUTHENTICATED
                    if role == "anonymous"
                    else grpc.StatusCode.PERMISSION_DENIED
                )
                if code != want:
                    failures.append(f"{role} {name}: expected {want.name}, got {code.name}")
    assert not failures, "\n".join(failures)


async def test_certificates_are_verified(srm):
    keys = srm.pki
    hb = pb.HeartbeatRequest(agent_id="agent1", sequence=1)
    for cert in (
        keys.cert("agent", "agent1"),  # the good one, for contrast
        (keys.path("rogue-agent1", "crt"), keys.path("rogue-agent1", "key")),  # wrong CA
        (keys.path("expired-agent1", "crt"), keys.path("expired-agent1", "key")),
        None,  # no certificate on the mutual-TLS listener
    ):
        stub = srm.stubs(srm.channel(cert=cert, agent_port=True)).rm
        try:
            resp = await stub.Heartbeat(hb, timeout=5)
            outcome = grpc.StatusCode.OK
            assert resp.action == pb.HEARTBEAT_ACTION_REREGISTER  # not registered yet
        except grpc.aio.AioRpcError as exc:
            outcome = exc.code()
        # A refused handshake ends before any RPC: the client sees UNAVAILABLE.
        good = cert == keys.cert("agent", "agent1")
        assert outcome == (grpc.StatusCode.OK if good else grpc.StatusCode.UNAVAILABLE), cert
    # On the users' listener, no certificate and no token: unauthenticated.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srm.stubs(srm.channel()).rm.Heartbeat(hb, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # A client that does not trust the RM's certificate never gets to talk to it.
    rogue_ca = keys.path("rogue-agent1", "crt")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srm.stubs(srm.channel("alice", ca=rogue_ca)).rm.ListEcms(
            pb.ListEcmsRequest(), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_an_agent_cannot_pass_for_another(srm):
    agent1 = srm.stubs(srm.channel(cert=srm.pki.cert("agent", "agent1"), agent_port=True))
    agent2 = srm.stubs(srm.channel(cert=srm.pki.cert("agent", "agent2"), agent_port=True))
    await agent2.rm.RegisterEcm(register("agent2", load_instance(4 * GiB, 4000, 4)))
    for request, rpc in (
        (pb.HeartbeatRequest(agent_id="agent2", sequence=1), agent1.rm.Heartbeat),
        (register("agent2", load_instance(GiB, 1000, 1)), agent1.rm.RegisterEcm),
        (pb.UnregisterEcmRequest(instance="agent2"), agent1.rm.UnregisterEcm),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stream = agent1.ecs.StreamAgentCommands(ec_pb.StreamAgentCommandsRequest(agent_id="agent2"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stream:
            pass
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # On a heartbeat stream each message is checked: agent1 beats as itself, then a
    # message as agent2 ends the stream, and agent2's sequence is not recorded.
    await agent1.rm.RegisterEcm(register("agent1", load_instance(4 * GiB, 4000, 4)))
    beats = agent1.rm.HeartbeatStream(timeout=10)
    own = pb.HeartbeatRequest(agent_id="agent1", sequence=1)
    answer = await beat_on_stream(beats, own)
    assert answer.action == pb.HEARTBEAT_ACTION_CONTINUE
    forged = pb.HeartbeatRequest(agent_id="agent2", sequence=5)
    await beats.write(pb.HeartbeatStreamRequest(heartbeat=forged))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await beats.read()
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "agent_id 'agent2'" in (err.value.details() or "")
    # agent2 is untouched and still heartbeats as itself (sequence 1: nothing recorded).
    resp = await agent2.rm.Heartbeat(pb.HeartbeatRequest(agent_id="agent2", sequence=1))
    assert resp.action == pb.HEARTBEAT_ACTION_CONTINUE
    assert resp.sequence == 1


async def test_heartbeat_reports_of_engineconns_on_another_ecm_are_ignored(srm):
    agent1 = srm.stubs(srm.channel(cert=srm.pki.cert("agent", "agent1"), agent_port=True))
    agent2 = srm.stubs(srm.channel(cert=srm.pki.cert("agent", "agent2"), agent_port=True))
    for stubs, agent_id in ((agent1, "agent1"), (agent2, "agent2")):
        await stubs.rm.RegisterEcm(register(agent_id, load_instance(4 * GiB, 4000, 4)))
    db = srm.server.core.db
    now = srm.server.core.clock.now()
    ec = EngineConn(
        ec_id="ec-on-agent2", state=EcState.IDLE, user="bob", labels=tuple(), params={},
        engine="shell", resource=load_resource(), created_at=now, updated_at=now,
    )  # fmt: skip
    idem = Idempotency.of("CreateEngineConn", "req-ec-on-agent2", b"")
    await db.run(lambda c: ec_store.claim_ec(c, ec, idem))
    await db.run(
        lambda c: ec_store.update_ec(
            c, "ec-on-agent2", now, state=EcState.IDLE, ecm_instance="agent2"
        )
    )
    forged = pb.HeartbeatRequest(
        agent_id="agent1",
        sequence=1,
        engine_conns=[
            ec_pb.EngineConnProcess(
                engine_conn_id="ec-on-agent2", state=ec_pb.PROCESS_STATE_EXITED, exit_code=1
            )
        ],
    )
    await agent1.rm.Heartbeat(forged)
    stored = await db.run(lambda c: ec_store.get_ec(c, "ec-on-agent2"))
    assert stored.state is EcState.IDLE  # agent1 cannot end agent2's EngineConn


def load_resource() -> Resource:
    return Resource.load_instance(GiB, 100, 1)


NOT_FOUND, DENIED_ = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED


async def test_users_act_only_on_their_own_tickets(srm, caplog):
    caplog.set_level("INFO", logger="labelrm.access")
    admin = srm.stubs(srm.channel("root"))
    alice = srm.stubs(srm.channel("alice"))
    bob = srm.stubs(srm.channel("bob"))
    await admin.rm.RegisterEcm(register("host1:9000", load_instance(8 * GiB, 8000, 8)))
    labels = ",emInstance=host1:9000"
    bobs = (await bob.rm.Apply(apply_req(BOB_LABELS + labels, load(GiB, 100)))).ticket
    alices = (await alice.rm.Apply(apply_req(ALICE_LABELS + labels, load(GiB, 100)))).ticket
    assert bobs.user == "bob" and alices.user == "alice"  # filled in from the token
    # Bob's ticket does not exist for alice (test_tenant_isolation.py has the details);
    # acting as bob is refused.
    for rpc, request, code in (
        (alice.rm.Release, pb.ReleaseRequest(ticket_id=bobs.ticket_id), NOT_FOUND),
        (alice.rm.ReportUsed, pb.ReportUsedRequest(ticket_id=bobs.ticket_id), NOT_FOUND),
        (alice.rm.GetTicket, pb.GetTicketRequest(ticket_id=bobs.ticket_id), NOT_FOUND),
        (alice.rm.ListTickets, pb.ListTicketsRequest(user="bob"), DENIED_),
        (alice.rm.Apply, apply_req(ALICE_LABELS + labels, load(GiB, 1), user="bob"), DENIED_),
        (alice.rm.Apply, apply_req(BOB_LABELS + labels, load(GiB, 1)), DENIED_),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc(request)
        assert err.value.code() == code, request
    still = (await bob.rm.GetTicket(pb.GetTicketRequest(ticket_id=bobs.ticket_id))).ticket
    assert still.state == pb.TICKET_STATE_LOCKED
    mine = (await alice.rm.ListTickets(pb.ListTicketsRequest())).tickets
    assert [t.ticket_id for t in mine] == [alices.ticket_id]
    everyone = (await admin.rm.ListTickets(pb.ListTicketsRequest())).tickets
    assert {t.ticket_id for t in everyone} == {alices.ticket_id, bobs.ticket_id}
    await bob.rm.Release(pb.ReleaseRequest(ticket_id=bobs.ticket_id))
    report = await admin.admin.CheckConsistency(admin_pb2.CheckConsistencyRequest())
    assert report.consistent
    # The access log names the caller of every call, refused ones included.
    callers = {(getattr(r, "caller", ""), getattr(r, "code", "")) for r in caplog.records}
    assert ("user:alice", "PERMISSION_DENIED") in callers and ("user:bob", "OK") in callers


async def test_engineconns_run_as_the_authenticated_user(srm):
    alice = srm.stubs(srm.channel("alice"))
    gateway = srm.stubs(srm.channel("gateway"))
    as_bob = ec_pb.CreateEngineConnRequest(
        request_id="create-as-bob", user="bob", labels=lbl("userCreator=bob-IDE,engineType=shell-1")
    )
    for request in (as_bob, ec_pb.CreateEngineConnRequest(labels=as_bob.labels)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice.ecs.CreateEngineConn(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "another user" in err.value.details()
    # A proxy user may: the policy lets it through (there is no ECM to run it on).
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await gateway.ecs.CreateEngineConn(as_bob, timeout=10)
    assert err.value.code() not in DENIED


async def _waiters(srm) -> int:
    """Apply calls queued waiting for room (the apply_waiter table)."""

    async def count(conn) -> int:
        cur = await conn.execute("SELECT count(*) FROM apply_waiter")
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    n: int = await srm.inner.core.db.run(count, read_only=True)
    return n


async def test_apply_rate_and_waiting_limits(database_url, keys):
    srm = await start_secure(
        database_url, keys, apply_rate=0.5, apply_burst=2, max_waiting_applies=1
    )
    try:
        admin = srm.stubs(srm.channel("root"))
        alice = srm.stubs(srm.channel("alice"))
        await admin.rm.RegisterEcm(register("host1:9000", load_instance(2 * GiB, 2000, 8)))
        labels = ALICE_LABELS + ",emInstance=host1:9000"
        first = (await alice.rm.Apply(apply_req(labels, load(2 * GiB, 100)))).ticket
        # The ECM is full: this one waits (and holds alice's only waiting slot).
        waiting = asyncio.ensure_future(alice.rm.Apply(apply_req(labels, load(GiB, 100), wait=20)))
        await wait_until(lambda: _waiters(srm), timeout=10)  # it is queued
        before = (await admin.rm.ListTickets(pb.ListTicketsRequest())).tickets
        with pytest.raises(grpc.aio.AioRpcError) as err:  # a second waiter
            await alice.rm.Apply(apply_req(labels, load(GiB, 100), wait=5))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(err.value) == TOO_MANY_WAITING
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the burst of 2 is spent
            await alice.rm.Apply(apply_req(labels, load(1, 1)))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(err.value) == RATE_LIMITED
        after = (await admin.rm.ListTickets(pb.ListTicketsRequest())).tickets
        assert after == before  # refusals changed nothing
        # Admins are exempt; the waiter is served when room is made.
        await admin.rm.Release(pb.ReleaseRequest(ticket_id=first.ticket_id))
        assert (await waiting).ticket.state == pb.TICKET_STATE_LOCKED
    finally:
        await stop_secure(srm)


async def test_oversized_messages_are_refused(database_url, keys):
    srm = await start_secure(database_url, keys, max_message_bytes=4096)
    try:
        alice = srm.stubs(srm.channel("alice"))
        big = apply_req(ALICE_LABELS, load(1, 1), request_id="x" * 10_000)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice.rm.Apply(big)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await stop_secure(srm)


def run_server(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rm_server", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_refuses_to_serve_the_network_unprotected(database_url, tmp_path):
    port = free_port()
    base = ("--database-url", database_url, "--data-dir", str(tmp_path))
    plain = run_server("--listen", f"0.0.0.0:{port}", *base)
    assert plain.returncode == 2 and "authentication off" in plain.stderr
    insecure = run_server("--listen", f"0.0.0.0:{port}", "--insecure", *base)
    assert insecure.returncode == 2 and "authentication off" in insecure.stderr
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("")
    no_tls = run_server("--listen", f"0.0.0.0:{port}", "--token-file", str(tokens), *base)
    assert no_tls.returncode == 2 and "without TLS" in no_tls.stderr


def test_insecure_flag_allows_plaintext_with_tokens(rm_process_factory, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("")
    proc = rm_process_factory("--insecure", "--token-file", str(tokens))
    proc.extra = (*proc.extra, "--listen", f"0.0.0.0:{proc.port}")  # the last --listen wins
    proc.start()
    with grpc.insecure_channel(proc.target) as channel:
        stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ListEcms(pb.ListEcmsRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    proc.terminate()
    assert "PLAINTEXT" in proc.log_path.read_text()


async def test_rmctl_authenticates_with_token_and_tls(srm, tmp_path, capsys):
    from rmctl import main

    base = ["--rm", srm.user_target, "--tls-ca", srm.pki.ca]
    alice = [*base, "--token", srm.pki.tokens["alice"]]
    assert await asyncio.to_thread(main, [*alice, "ticket", "list"]) == 0
    assert await asyncio.to_thread(main, [*base, "ticket", "list"]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    assert await asyncio.to_thread(main, [*alice, "limit", "list"]) == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err
    # Local commands: a new CA and certificates, and a token in a token file.
    assert main(["pki", "dev", "--dir", str(tmp_path / "pki"), "--agent-id", "a9"]) == 0
    assert (tmp_path / "pki" / "agent-a9.crt").exists()
    token_file = tmp_path / "tokens.toml"
    assert main(["token", "add", "--file", str(token_file), "--user", "dave"]) == 0
    token = capsys.readouterr().out.splitlines()[-2]
    assert token.startswith("lrm_") and token not in token_file.read_text()
