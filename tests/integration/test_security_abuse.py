"""Hostile callers on a secured RM (TLS, tokens, the mutual-TLS agent listener): token
guessing that must not lock out valid tokens, revoked tokens on open streams, client-CA
certificates that are not agents, and cheap denial of service through big requests
and floods of calls."""

from __future__ import annotations

import asyncio
import http.client
import math
import ssl
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc
from labelrm.v1 import admin_pb2, resource_pb2
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from labelrm_common import pki, tokens
from rm_server.security.limits import RATE_LIMITED, TOO_MANY_AUTH_FAILURES, TOO_MANY_STREAMS
from tests.integration.security_fixtures import (
    Pki,
    engine_conn_of,
    make_pki,
    start_secure,
    stop_secure,
)
from tests.support.messages import GiB, lbl, load_instance, register
from tests.support.refusals import reason_of
from tests.support.rm import beat_on_stream
from tests.support.waiting import wait_until

ALICE = "userCreator=alice-IDE,engineType=spark-3.2.1"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("abuse-pki"))


def host_certificate(keys: Pki, name: str) -> tuple[str, str]:
    """A certificate the client CA signed for a host, as an operator's CA would: CN and
    DNS name `name`, and no labelrm:// identity."""
    ca = pki.Issued(Path(keys.ca).read_bytes(), Path(keys.path("ca", "key")).read_bytes())
    host = pki.sign(ca, name, [x509.DNSName(name)], [], valid_for=timedelta(hours=1))
    crt, pem_key = keys.path(f"host-{name}", "crt"), keys.path(f"host-{name}", "key")
    Path(crt).write_bytes(host.cert_pem)
    Path(pem_key).write_bytes(host.key_pem)
    return crt, pem_key


# ----- failed authentications never lock out a valid credential --------------------------------


async def test_token_guessing_never_locks_out_valid_tokens(database_url, keys):
    srm = await start_secure(database_url, keys, auth_failure_limit=5)
    try:
        for i in range(5):
            guess = srm.stubs(srm.channel(token=f"lrm_guess{i}")).rm
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await guess.ListEcms(pb.ListEcmsRequest())
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # The address is now throttled, for invalid tokens only ...
        guess = srm.stubs(srm.channel(token="lrm_guess-more")).rm
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await guess.ListEcms(pb.ListEcmsRequest())
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(err.value) == TOO_MANY_AUTH_FAILURES
        # ... while valid tokens from the same address, admin's and users', still work,
        # between and after further guesses.
        for who in ("root", "alice", "bob"):
            await srm.stubs(srm.channel(who)).rm.ListEcms(pb.ListEcmsRequest())
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await guess.ListEcms(pb.ListEcmsRequest())
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Certificate holders (agents, EngineConns) are not affected either.
        agent = srm.stubs(srm.channel(cert=keys.cert("agent", "agent1"), agent_port=True)).rm
        await agent.Heartbeat(pb.HeartbeatRequest(agent_id="agent1", sequence=1))
    finally:
        await stop_secure(srm)


# ----- a revoked token ends the streams it opened ----------------------------------------------------


def launch_on_agent1(srm: Any, request_id: str) -> asyncio.Future[Any]:
    """alice's CreateEngineConn on agent1, in the background: it queues a launch command
    (with the EngineConn's secret and key) for agent1's command stream."""
    alice = srm.stubs(srm.channel("alice"))
    launched: asyncio.Future[Any] = asyncio.ensure_future(
        alice.ecs.CreateEngineConn(
            ec_pb.CreateEngineConnRequest(
                request_id=request_id,
                labels=lbl("userCreator=alice-IDE,engineType=shell-1,emInstance=agent1"),
                timeout=Duration(seconds=20),
            ),
            timeout=30,
        )
    )
    return launched


async def open_command_stream(srm: Any, agent: Any) -> tuple[Any, asyncio.Future[Any]]:
    """agent1's StreamAgentCommands, shown open (admitted) by a first launch it delivers."""
    await agent.rm.RegisterEcm(register("agent1", load_instance(8 * GiB, 8000, 8)))
    commands = agent.ecs.StreamAgentCommands(
        ec_pb.StreamAgentCommandsRequest(agent_id="agent1"), timeout=60
    )
    create = launch_on_agent1(srm, "before-revoke")
    first = await commands.read()
    assert first.command.HasField("launch")
    return commands, create


async def test_a_revoked_agent_token_ends_its_open_streams(database_url, tmp_path):
    keys = make_pki(tmp_path / "pki")  # its own token file: this test revokes from it
    srm = await start_secure(database_url, keys, create_timeout=30.0)
    creates = []
    try:
        agent = srm.stubs(srm.channel("agent1"))  # the agent role, by token
        commands, create = await open_command_stream(srm, agent)
        creates.append(create)
        beats = agent.rm.HeartbeatStream(timeout=60)
        first = await beat_on_stream(beats, pb.HeartbeatRequest(agent_id="agent1", sequence=1))
        assert first.action == pb.HEARTBEAT_ACTION_CONTINUE
        assert tokens.revoke(Path(keys.token_file), user="agent1") == 1
        # A launch queued after the revocation is never delivered: the stream ends.
        creates.append(launch_on_agent1(srm, "after-revoke"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            got = await commands.read()
            pytest.fail(f"a revoked agent was sent {got}")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert reason_of(err.value) == "TOKEN_REVOKED"
        # The heartbeat stream answers no further message either (it may have ended
        # already, idle, before this one is written).
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await beats.write(
                pb.HeartbeatStreamRequest(
                    heartbeat=pb.HeartbeatRequest(agent_id="agent1", sequence=2)
                )
            )
            await beats.read()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # New calls with the token are refused as before.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent.rm.Heartbeat(pb.HeartbeatRequest(agent_id="agent1", sequence=3))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        for create in creates:
            create.cancel()
        await stop_secure(srm)


async def test_an_idle_stream_ends_when_its_token_is_revoked(database_url, tmp_path):
    keys = make_pki(tmp_path / "pki")
    srm = await start_secure(database_url, keys, create_timeout=30.0)
    create = None
    try:
        agent = srm.stubs(srm.channel("agent1"))
        commands, create = await open_command_stream(srm, agent)
        reading = asyncio.ensure_future(commands.read())  # nothing more is queued
        tokens.revoke(Path(keys.token_file), user="agent1")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(reading, timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert reason_of(err.value) == "TOKEN_REVOKED"
    finally:
        if create is not None:
            create.cancel()
        await stop_secure(srm)


# ----- who is an agent ----------------------------------------------------------------------------------


async def test_a_client_ca_certificate_without_the_agent_uri_is_not_an_agent(database_url, keys):
    host_cert = host_certificate(keys, "agent3")
    srm = await start_secure(database_url, keys)
    try:
        host = srm.stubs(srm.channel(cert=host_cert, agent_port=True))
        for call in (
            host.rm.RegisterEcm(register("agent3", load_instance(GiB, 1000, 1)), timeout=10),
            host.rm.Heartbeat(pb.HeartbeatRequest(agent_id="agent3", sequence=1), timeout=10),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "allow_host_certificates" in (err.value.details() or "")
        commands = host.ecs.StreamAgentCommands(
            ec_pb.StreamAgentCommandsRequest(agent_id="agent3"), timeout=10
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await commands.read()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        admin = srm.stubs(srm.channel("root"))
        ecms = (await admin.rm.ListEcms(pb.ListEcmsRequest())).ecms
        assert "agent3" not in {e.instance for e in ecms}
    finally:
        await stop_secure(srm)
    # The operator may allow named host certificates: then it is the agent it names.
    srm = await start_secure(database_url, keys, allow_host_certificates=True)
    try:
        host = srm.stubs(srm.channel(cert=host_cert, agent_port=True))
        await host.rm.RegisterEcm(register("agent3", load_instance(GiB, 1000, 1)), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.rm.RegisterEcm(register("agent1", load_instance(GiB, 1000, 1)), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await stop_secure(srm)


# ----- cheap denial of service: counts and sizes, user-sized messages, rates -------------------


def trailer_bytes(err: grpc.aio.AioRpcError) -> int:
    """How big the status trailer of a refused call was (details and metadata)."""
    size = len(err.details() or "")
    for key, value in err.trailing_metadata() or ():
        size += len(key) + len(value)
    return size


async def test_counts_and_sizes_are_refused_before_any_per_item_work(database_url, keys):
    srm = await start_secure(database_url, keys)
    try:
        alice = srm.stubs(srm.channel("alice"))
        admin = srm.stubs(srm.channel("root"))
        await admin.rm.RegisterEcm(register("host1:9000", load_instance(8 * GiB, 8000, 8)))
        before = (await admin.rm.ListLabelResources(pb.ListLabelResourcesRequest())).label_resources
        many = [resource_pb2.Label(key=f"k{i}", value="v") for i in range(2000)]
        special = resource_pb2.Resource(
            special=resource_pb2.SpecialResource(quantities={f"g{i}": 1 for i in range(10_000)})
        )
        long_key = "k" * 200_000
        attacks = [
            (alice.rm.GetLabelResource, pb.GetLabelResourceRequest(labels=many), "labels"),
            (
                alice.rm.Apply,
                pb.ApplyRequest(labels=lbl(ALICE + ",emInstance=host1:9000"), resource=special),
                "resource.special.quantities",
            ),
            (
                alice.rm.GetLabelResource,
                pb.GetLabelResourceRequest(labels=[resource_pb2.Label(key=long_key, value="v")]),
                "labels[0].key",
            ),
            (
                alice.rm.GetLabelResource,
                pb.GetLabelResourceRequest(
                    labels=[resource_pb2.Label(key="userCreator", value="a" * 200_000)]
                ),
                "labels[0].value",
            ),
            (
                alice.rm.Apply,
                pb.ApplyRequest(
                    labels=lbl(ALICE + ",emInstance=host1:9000"),
                    resource=resource_pb2.Resource(
                        special=resource_pb2.SpecialResource(quantities={"g" * 100_000: 1})
                    ),
                ),
                "resource.special.quantities",
            ),
        ]
        for rpc, request, field in attacks:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await rpc(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert (err.value.details() or "").startswith(field + ":"), err.value.details()
            # The offending value is quoted cut short, never whole.
            assert trailer_bytes(err.value) < 2048, field
        after = (await admin.rm.ListLabelResources(pb.ListLabelResourcesRequest())).label_resources
        assert after == before  # nothing stored
        # A user RPC's request is bounded by the user-sized limit, far below the agents':
        # on the users' listener gRPC itself refuses it (that listener receives no more),
        huge = pb.GetLabelResourceRequest(
            labels=[resource_pb2.Label(key="k", value="v" * 4_000_000)]
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice.rm.GetLabelResource(huge, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (err.value.details() or "")
        # and on the agents' listener (a user certificate) the interceptor, unparsed.
        alice_cert = srm.stubs(srm.channel(cert=keys.cert("user", "alice"), agent_port=True))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice_cert.rm.GetLabelResource(huge, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(err.value) == "MESSAGE_TOO_LARGE"
        assert "user_max_message_bytes" in (err.value.details() or "")
        assert trailer_bytes(err.value) < 2048
        # An agent's heartbeat is not a user RPC: a big one passes.
        agent = srm.stubs(srm.channel(cert=keys.cert("agent", "agent1"), agent_port=True))
        await agent.rm.RegisterEcm(register("agent1", load_instance(GiB, 1000, 1)))
        big_beat = pb.HeartbeatRequest(
            agent_id="agent1",
            sequence=1,
            engine_conns=[
                ec_pb.EngineConnProcess(
                    engine_conn_id=f"ec-unknown-{i:05d}",
                    state=ec_pb.PROCESS_STATE_RUNNING,
                    log_tail="x" * 4000,
                )
                for i in range(100)
            ],
        )
        assert big_beat.ByteSize() > 256 * 1024
        await agent.rm.Heartbeat(big_beat, timeout=30)
    finally:
        await stop_secure(srm)


async def test_one_users_flood_is_rate_limited_without_starving_others(database_url, keys):
    srm = await start_secure(database_url, keys, call_rate=0.1, call_burst=5)
    try:
        admin = srm.stubs(srm.channel("root"))
        await admin.rm.RegisterEcm(register("host1:9000", load_instance(8 * GiB, 8000, 8)))
        bob = srm.stubs(srm.channel("bob"))
        request = pb.GetLabelResourceRequest(labels=lbl("emInstance=host1:9000"))
        refused = 0
        started = time.monotonic()
        for _ in range(20):
            try:
                await bob.rm.GetLabelResource(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert reason_of(exc) == RATE_LIMITED and "call_rate" in (exc.details() or "")
                refused += 1
        # A burst of 5, then one call per ten seconds of however long the 20 took.
        allowed = 5 + math.ceil((time.monotonic() - started) * 0.1)
        assert refused >= 20 - allowed
        # Every kind of user RPC counts, not only Apply: bob's other calls are refused too.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bob.rm.ListTickets(pb.ListTicketsRequest(), timeout=10)
        assert reason_of(err.value) == RATE_LIMITED
        # Other users, the admin and the health check are served meanwhile.
        alice = srm.stubs(srm.channel("alice"))
        await alice.rm.GetLabelResource(request, timeout=10)
        await admin.rm.GetLabelResource(request, timeout=10)
        health = health_pb2_grpc.HealthStub(srm.channel())
        status = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await stop_secure(srm)


async def test_engineconn_certificates_count_against_their_owners_rate(database_url, keys):
    """A user floods ReportEngineConnState with their EngineConn's certificate: the calls
    count against the rate of the owner's EngineConns, as the owner's token calls count
    against the owner's."""
    srm = await start_secure(database_url, keys, call_rate=0.1, call_burst=10)
    try:
        certs = {
            ec_id: await engine_conn_of(srm, ec_id, user)
            for ec_id, user in (("ec-a1", "alice"), ("ec-a2", "alice"), ("ec-b1", "bob"))
        }

        def stubs(ec_id: str) -> Any:
            return srm.stubs(srm.channel(cert=certs[ec_id], agent_port=True))

        def report(ec_id: str) -> ec_pb.ReportEngineConnStateRequest:
            return ec_pb.ReportEngineConnStateRequest(
                engine_conn_id=ec_id, state=ec_pb.ENGINE_CONN_STATE_IDLE, address="127.0.0.1:9"
            )

        flood = stubs("ec-a1")
        refused = 0
        for _ in range(600):
            try:
                await flood.ecs.ReportEngineConnState(report("ec-a1"), timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
                assert reason_of(exc) == RATE_LIMITED and "call_rate" in (exc.details() or "")
                refused += 1
        assert refused >= 580  # a burst of 10, then one call in ten seconds
        # The owner's other EngineConn draws on the same rate: refused at once.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stubs("ec-a2").ecs.ReportEngineConnState(report("ec-a2"), timeout=10)
        assert reason_of(err.value) == RATE_LIMITED
        assert "EngineConns of user 'alice'" in (err.value.details() or "")
        # Another user's EngineConn, and alice's own token calls, are served meanwhile.
        await stubs("ec-b1").ecs.ReportEngineConnState(report("ec-b1"), timeout=10)
        alice = srm.stubs(srm.channel("alice"))
        await alice.ecs.ListEngineConns(ec_pb.ListEngineConnsRequest(), timeout=10)
    finally:
        await stop_secure(srm)


async def test_anonymous_health_watch_streams_are_capped_per_peer(database_url, keys):
    srm = await start_secure(database_url, keys, max_watch_streams=3)
    try:
        health = health_pb2_grpc.HealthStub(srm.channel())  # no credentials at all
        watches = []
        for _ in range(3):
            watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            watches.append(watch)
        extra = health.Watch(health_pb2.HealthCheckRequest(), timeout=60)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await extra.read()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(err.value) == TOO_MANY_STREAMS
        # The one-shot Check is not a stream: still answered.
        assert (await health.Check(health_pb2.HealthCheckRequest(), timeout=10)).status == 1
        # A closed stream frees its place.
        watches.pop().cancel()

        async def another() -> bool:
            watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=60)
            try:
                await watch.read()
            except grpc.aio.AioRpcError:
                return False
            watches.append(watch)
            return True

        await wait_until(another, timeout=10)
        for watch in watches:
            watch.cancel()
    finally:
        await stop_secure(srm)


# ----- the metrics endpoint off loopback -------------------------------------------------------------


def scrape(url: str, ca: str, token: str = "") -> tuple[int, bytes]:
    """GET `url` (verifying the server with `ca`); (HTTP status, body)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False  # the RM's test certificate names localhost
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def test_metrics_off_loopback_need_tls_and_an_admin_token(database_url, keys):
    srm = await start_secure(database_url, keys, metrics_listen="0.0.0.0:0")
    try:
        url = f"https://127.0.0.1:{srm.server.metrics_port}/metrics"
        for who in ("", "alice", "agent1"):
            token = keys.tokens[who] if who else ""
            status, _ = await asyncio.to_thread(scrape, url, keys.ca, token)
            assert status == 401, who
        status, body = await asyncio.to_thread(scrape, url, keys.ca, keys.tokens["root"])
        assert status == 200 and b"labelrm_" in body
        # Plain HTTP gets no answer at all.
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            await asyncio.to_thread(
                urllib.request.urlopen,
                f"http://127.0.0.1:{srm.server.metrics_port}/metrics",
                timeout=10,
            )
    finally:
        await stop_secure(srm)


async def test_a_required_include_list_denies_unlisted_agents(database_url, keys):
    srm = await start_secure(database_url, keys, node_include_required=True)
    try:
        admin = srm.stubs(srm.channel("root"))
        agent1 = srm.stubs(srm.channel(cert=keys.cert("agent", "agent1"), agent_port=True))
        agent2 = srm.stubs(srm.channel(cert=keys.cert("agent", "agent2"), agent_port=True))
        # Nothing listed yet: no agent may register, however good its certificate.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent1.rm.RegisterEcm(register("agent1", load_instance(GiB, 1000, 1)))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(err.value) == "NODE_EXCLUDED"
        await admin.admin.RefreshNodes(admin_pb2.RefreshNodesRequest(include=["agent2"]))
        await agent2.rm.RegisterEcm(register("agent2", load_instance(GiB, 1000, 1)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent1.rm.RegisterEcm(register("agent1", load_instance(GiB, 1000, 1)))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        ecms = (await admin.rm.ListEcms(pb.ListEcmsRequest())).ecms
        assert [e.instance for e in ecms] == ["agent2"]
    finally:
        await stop_secure(srm)
