"""Hostile callers on a secured RM (TLS, tokens, the mutual-TLS agent listener): token
guessing that must not lock out valid tokens, revoked tokens on open streams, client-CA
certificates that are not agents, and cheap denial of service through big requests
and floods of calls."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from rm_server.security import tokens
from rm_server.security.limits import TOO_MANY_AUTH_FAILURES
from tests.helpers import GiB, beat_on_stream, lbl, load_instance, register
from tests.integration.security_fixtures import Pki, make_pki, start_secure, stop_secure
from tests.integration.test_security import reason_of


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("abuse-pki"))


def host_certificate(keys: Pki, name: str) -> tuple[str, str]:
    """A certificate the client CA signed for a host, as an operator's CA would: CN and
    DNS name `name`, and no labelrm:// identity."""
    ca_key = serialization.load_pem_private_key(
        Path(keys.path("ca", "key")).read_bytes(), password=None
    )
    ca_cert = x509.load_pem_x509_certificate(Path(keys.ca).read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    crt, pem_key = keys.path(f"host-{name}", "crt"), keys.path(f"host-{name}", "key")
    Path(crt).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    Path(pem_key).write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
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


async def test_a_revoked_agent_token_ends_its_open_streams(database_url, tmp_path):
    keys = make_pki(tmp_path / "pki")  # its own token file: this test revokes from it
    srm = await start_secure(database_url, keys, create_timeout=30.0)
    try:
        agent = srm.stubs(srm.channel("agent1"))  # the agent role, by token
        await agent.rm.RegisterEcm(register("agent1", load_instance(8 * GiB, 8000, 8)))
        beats = agent.rm.HeartbeatStream(timeout=60)
        first = await beat_on_stream(beats, pb.HeartbeatRequest(agent_id="agent1", sequence=1))
        assert first.action == pb.HEARTBEAT_ACTION_CONTINUE
        commands = agent.ecs.StreamAgentCommands(
            ec_pb.StreamAgentCommandsRequest(agent_id="agent1"), timeout=60
        )
        assert tokens.revoke(Path(keys.token_file), user="agent1") == 1
        # A launch for the agent queued after the revocation (it would carry the
        # EngineConn's secret and key) is never delivered: the stream ends instead.
        alice = srm.stubs(srm.channel("alice"))
        create = asyncio.ensure_future(
            alice.ecs.CreateEngineConn(
                ec_pb.CreateEngineConnRequest(
                    request_id="after-revoke",
                    labels=lbl("userCreator=alice-IDE,engineType=shell-1,emInstance=agent1"),
                    timeout=Duration(seconds=20),
                ),
                timeout=30,
            )
        )
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                got = await commands.read()
                pytest.fail(f"a revoked agent was sent {got}")
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert reason_of(err.value) == "TOKEN_REVOKED"
            # The heartbeat stream answers no further message either.
            await beats.write(
                pb.HeartbeatStreamRequest(
                    heartbeat=pb.HeartbeatRequest(agent_id="agent1", sequence=2)
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await beats.read()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            create.cancel()
        # New calls with the token are refused as before.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent.rm.Heartbeat(pb.HeartbeatRequest(agent_id="agent1", sequence=3))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await stop_secure(srm)


async def test_an_idle_stream_ends_when_its_token_is_revoked(database_url, tmp_path):
    keys = make_pki(tmp_path / "pki")
    srm = await start_secure(database_url, keys)
    try:
        agent = srm.stubs(srm.channel("agent1"))
        await agent.rm.RegisterEcm(register("agent1", load_instance(8 * GiB, 8000, 8)))
        commands = agent.ecs.StreamAgentCommands(
            ec_pb.StreamAgentCommandsRequest(agent_id="agent1"), timeout=60
        )
        reading = asyncio.ensure_future(commands.read())
        tokens.revoke(Path(keys.token_file), user="agent1")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(reading, timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
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
