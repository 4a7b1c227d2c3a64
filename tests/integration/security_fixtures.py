"""A secured in-process RM for the security tests: TLS on `listen` for token users,
mutual TLS on `agent_listen` for agents and EngineConns, the same throwaway CA issuing
EngineConn certificates, and a token file."""

from __future__ import annotations

import contextlib
import re
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
from labelrm.v1 import (
    admin_pb2_grpc,
    demand_pb2_grpc,
    engine_conn_pb2_grpc,
    resource_manager_pb2_grpc,
)

from bench.serving import free_port
from labelrm_client._channel import ChannelSecurity, aio_channel
from labelrm_common import pki, tokens
from rm_server.domain.engineconn import EcState, EngineConn
from rm_server.domain.resources import Resource
from rm_server.store import engineconns as ec_store
from rm_server.store.db import Idempotency
from tests.fixtures.rm import RMProcess
from tests.support.agents import start_agent_on
from tests.support.env import ENGINECONN_TEST_SETTINGS
from tests.support.messages import GiB
from tests.support.rm import InProcessRM, start_in_process, stop_in_process

USERS = {"alice": ["user"], "bob": ["user"], "gateway": ["user"], "root": ["admin"]}


@dataclass
class Pki:
    """Files of a throwaway PKI (and a second, untrusted CA)."""

    root: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def path(self, stem: str, ext: str) -> str:
        return str(self.root / f"{stem}.{ext}")

    @property
    def ca(self) -> str:
        return self.path("ca", "crt")

    @property
    def token_file(self) -> str:
        return str(self.root / "tokens.toml")

    def cert(self, kind: str, name: str) -> tuple[str, str]:
        stem = pki.file_stem(kind, name)
        return self.path(stem, "crt"), self.path(stem, "key")


def make_pki(root: Path) -> Pki:
    out = Pki(root)
    pki.dev_pki(root, "agent1", days=1)
    ca = pki.load_ca(root)
    for kind, name in (("agent", "agent2"), ("engineconn", "ec-matrix"), ("user", "alice")):
        pki.save(root, pki.file_stem(kind, name), pki.issue(ca, kind, name))
    expired = pki.issue(
        ca, "agent", "agent1", valid_for=timedelta(hours=1), now=datetime.now(UTC) - timedelta(1)
    )
    pki.save(root, "expired-agent1", expired)
    other_ca = pki.create_ca("untrusted CA")
    pki.save(root, "rogue-agent1", pki.issue(other_ca, "agent", "agent1"))
    for user, roles in USERS.items():
        out.tokens[user] = tokens.add_token(Path(out.token_file), user, roles)
    out.tokens["agent1"] = tokens.add_token(Path(out.token_file), "agent1", ["agent"])
    return out


def secure_settings(p: Pki, **overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "tls_cert": p.path("server", "crt"),
        "tls_key": p.path("server", "key"),
        "tls_client_ca": p.ca,
        "agent_listen": "127.0.0.1:0",
        "tls_issuer_cert": p.ca,
        "tls_issuer_key": p.path("ca", "key"),
        "token_file": p.token_file,
        "proxy_users": "gateway",
    }
    settings.update(overrides)
    return settings


@dataclass
class SecureRM:
    inner: InProcessRM
    pki: Pki
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    @property
    def server(self) -> Any:
        return self.inner.server

    @property
    def user_target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def agent_target(self) -> str:
        return f"127.0.0.1:{self.server.agent_port}"

    def channel(
        self,
        token_of: str = "",
        cert: tuple[str, str] | None = None,
        *,
        agent_port: bool = False,
        token: str = "",
        ca: str | None = None,
    ) -> grpc.aio.Channel:
        """A channel as a user (token), an agent or EngineConn (certificate), or nobody."""
        security = ChannelSecurity(
            tls_ca=self.pki.ca if ca is None else ca,
            tls_cert=cert[0] if cert else "",
            tls_key=cert[1] if cert else "",
            token=token or (self.pki.tokens[token_of] if token_of else ""),
        )
        target = self.agent_target if agent_port else self.user_target
        channel = aio_channel(target, security)
        self.channels.append(channel)
        return channel

    def stubs(self, channel: grpc.aio.Channel) -> Stubs:
        return Stubs(channel)


class Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(channel)
        self.ecs = engine_conn_pb2_grpc.EngineConnServiceStub(channel)
        self.demands = demand_pb2_grpc.DemandServiceStub(channel)


async def engine_conn_of(srm: SecureRM, ec_id: str, user: str) -> tuple[str, str]:
    """An IDLE EngineConn `ec_id` of `user` in the RM's database, and the certificate the
    RM's issuing CA gives it (what its launch material holds)."""
    now = srm.server.core.clock.now()
    ec = EngineConn(
        ec_id=ec_id, state=EcState.IDLE, user=user, labels=tuple(), params={},
        engine="shell", resource=Resource.load_instance(GiB, 100, 1), created_at=now,
        updated_at=now,
    )  # fmt: skip
    idem = Idempotency.of("CreateEngineConn", f"req-{ec_id}", b"")
    await srm.server.core.db.run(lambda c: ec_store.claim_ec(c, ec, idem))
    root = Path(srm.pki.root)
    pki.save(
        root, pki.file_stem("engineconn", ec_id), pki.issue(pki.load_ca(root), "engineconn", ec_id)
    )
    return srm.pki.cert("engineconn", ec_id)


async def start_secure(database_url: str, p: Pki, **overrides: Any) -> SecureRM:
    inner = await start_in_process(database_url, **secure_settings(p, **overrides))
    return SecureRM(inner, p)


async def stop_secure(rm: SecureRM) -> None:
    for channel in rm.channels:
        await channel.close()
    await stop_in_process(rm.inner)


@contextlib.asynccontextmanager
async def secure_cluster(
    database_url: str, tmp_path: Path, users: tuple[str, ...], **overrides: Any
) -> AsyncIterator[SecureRM]:
    """A secured RM (TLS, tokens, the mutual-TLS agent listener) with EngineConn test
    intervals, a `user` token for each of `users` (in `pki.tokens`), stopped on the way out."""
    keys = make_pki(tmp_path / "pki")
    for user in users:
        keys.tokens[user] = tokens.add_token(Path(keys.token_file), user, ["user"])
    srm = await start_secure(
        database_url, keys, **{**ENGINECONN_TEST_SETTINGS, "ec_cert_hours": 1.0, **overrides}
    )
    try:
        yield srm
    finally:
        await stop_secure(srm)


async def start_secure_agent(cluster: SecureRM, agent_factory: Callable[..., Any]) -> Any:
    """A real agent `agent1` on the mutual-TLS listener (its certificate from the PKI),
    registered and beating; returns the AgentProcess."""
    keys = cluster.pki
    cert, key = keys.cert("agent", "agent1")
    admin = cluster.stubs(cluster.channel("root"))
    tls = ("--tls-ca", keys.ca, "--tls-cert", cert, "--tls-key", key)
    return await start_agent_on(agent_factory, cluster.agent_target, admin.rm, "agent1", *tls)


@dataclass
class SecuredProcess:
    """A real rm-server process with TLS and tokens (`start_secured_process`), and
    channels to it."""

    proc: RMProcess
    keys: Pki
    agent_port: int = 0
    metrics_port: int = 0
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    def channel(
        self, token_of: str = "", cert: tuple[str, str] | None = None, agent: bool = False
    ) -> grpc.aio.Channel:
        """A channel as a user (token), an agent (certificate, ``agent``: on the agents'
        listener), or nobody."""
        security = ChannelSecurity(
            tls_ca=self.keys.ca,
            tls_cert=cert[0] if cert else "",
            tls_key=cert[1] if cert else "",
            token=self.keys.tokens[token_of] if token_of else "",
        )
        target = f"127.0.0.1:{self.agent_port}" if agent else self.proc.target
        channel = aio_channel(target, security)
        self.channels.append(channel)
        return channel

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def memory(self, key: str = "VmRSS", pid: int = 0) -> int:
        """A process's resident memory (VmRSS) or its peak so far (VmHWM), in bytes (the
        RM's, or `pid`'s)."""
        status = Path(f"/proc/{pid or self.pid}/status").read_text()
        found = re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None, status
        return int(found.group(1)) * 1024

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return str(answer.read().decode())

    def rpc_count(self, method: str, extra: str = "") -> float:
        """Calls of `method` the RM's Python layer finished, by its metrics (`extra`: a
        further label matcher, such as ``process="agents"``)."""
        found = re.findall(
            rf'^labelrm_rpc_total{{([^}}]*method="{re.escape(method)}"[^}}]*)}} (\S+)$',
            self.metrics(),
            re.MULTILINE,
        )
        return sum(float(v) for labels, v in found if extra in labels)

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


def start_secured_process(
    factory: Callable[..., RMProcess], keys: Pki, *, agents: bool = True
) -> SecuredProcess:
    """A real rm-server process (from `rm_process_factory`) with TLS, tokens and a
    loopback metrics endpoint: with the mutual-TLS agent listener (``agents=True``) or
    one listener for everyone, agents by token (``agents=False``)."""
    agent_port, metrics_port = free_port(), free_port()
    args = [
        "--tls-cert", keys.path("server", "crt"), "--tls-key", keys.path("server", "key"),
        "--token-file", keys.token_file,
        "--metrics-listen", f"127.0.0.1:{metrics_port}",
    ]  # fmt: skip
    if agents:
        args += [
            "--tls-client-ca", keys.ca, "--agent-listen", f"127.0.0.1:{agent_port}",
            "--tls-issuer-cert", keys.ca, "--tls-issuer-key", keys.path("ca", "key"),
        ]  # fmt: skip
    proc = factory(*args)
    proc.tls_ca = keys.ca
    proc.start()
    return SecuredProcess(proc, keys, agent_port if agents else 0, metrics_port)
