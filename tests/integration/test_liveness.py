"""The RM's own silence condemns nobody (docs/architecture.md, "Liveness").

rm-server runs as a real process with authentication on (TLS and tokens for users, the
mutual-TLS listener for agents and EngineConns, EngineConn certificates issued by the
RM), with a real agent launching a real EngineConn through sudo. The RM is paused
(SIGSTOP), killed and restarted, or loses its database, each for twice the expiry:
afterwards neither the agent nor the EngineConn is LOST and the EngineConn still runs
code; after a longer outage the agent is still back within its grace window. The
controls: an agent that really dies is still LOST; agents that all fall silent at once
are a suspected disruption, not a dead fleet.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as rm_pb
from labelrm.v1 import resource_manager_pb2_grpc

from bench.serving import free_port
from labelrm_client import AsyncRMClient, ExecOutput, ExecResult
from labelrm_client._channel import ChannelSecurity, aio_channel
from labelrm_common import pki, tokens
from tests.integration.security_fixtures import Pki, make_pki
from tests.support.agents import start_agent_on
from tests.support.sdk import details
from tests.support.waiting import log_tail, wait_until

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"
# Expiries long enough for an agent to get back through its reconnect backoff within a
# fresh grace window, short enough to keep the tests quick.
EXPIRY = 8.0
OUTAGE = 2 * EXPIRY  # every stall, outage and silence below lasts twice the expiry
LONG_OUTAGE = 45.0  # except this one, after which gRPC's own reconnect backoff is ~25 s
FLAGS = (
    "--sweep-interval=0.2",
    f"--ecm-expiry={EXPIRY}",
    f"--ec-expiry={EXPIRY}",
    "--agent-heartbeat-interval=0.5",
    "--ec-heartbeat-interval=0.5",
    "--create-timeout=30",
    "--kill-grace=2",
)
LIVE = {
    ec_pb.ENGINE_CONN_STATE_STARTING,
    ec_pb.ENGINE_CONN_STATE_IDLE,
    ec_pb.ENGINE_CONN_STATE_BUSY,
    ec_pb.ENGINE_CONN_STATE_SHUTTING_DOWN,
}


def ts(stamp: Any) -> datetime:
    when: datetime = stamp.ToDatetime(tzinfo=UTC)
    return when


@dataclass
class Cluster:
    """A secured rm-server process and the clients of its admin and of lrmtest_a."""

    rm: Any  # tests.fixtures.rm.RMProcess
    keys: Pki
    agent_port: int
    clients: list[AsyncRMClient] = field(default_factory=list)

    @property
    def agent_target(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    def client(self, user: str) -> AsyncRMClient:
        """A new client as `user` (new channels: after an RM restart the old ones may
        sit in gRPC's reconnect backoff)."""
        made = AsyncRMClient(
            self.rm.target, token=self.keys.tokens[user], tls_ca=self.keys.ca, timeout=10
        )
        self.clients.append(made)
        return made

    async def start_agent(self, agent_factory: Callable[..., Any], agent_id: str) -> Any:
        cert, key = self.keys.cert("agent", agent_id)
        tls = ("--tls-ca", self.keys.ca, "--tls-cert", cert, "--tls-key", key)
        security = ChannelSecurity(tls_ca=self.keys.ca, token=self.keys.tokens["root"])
        async with aio_channel(self.rm.target, security) as channel:
            stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
            return await start_agent_on(agent_factory, self.agent_target, stub, agent_id, *tls)

    async def start_engineconn(self) -> Any:
        ec = await self.client("lrmtest_a").create_engine_conn(
            SHELL_A, timeout=30, request_id="liveness-ec-1"
        )
        assert ec.state == ec_pb.ENGINE_CONN_STATE_IDLE
        return ec


MakeCluster = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def make_cluster(
    rm_process_factory: Any, tmp_path: Path, sudo_users: tuple[str, ...]
) -> AsyncIterator[MakeCluster]:
    """Starts a secured rm-server (on the test's database, or `url`) with the liveness
    settings above; tokens for root (admin) and the test users, certificates for agent1
    to agent3."""
    made: list[Cluster] = []

    async def make(url: str | None = None) -> Cluster:
        keys = make_pki(tmp_path / "pki")
        ca = pki.load_ca(tmp_path / "pki")
        pki.save(keys.root, pki.file_stem("agent", "agent3"), pki.issue(ca, "agent", "agent3"))
        for user in sudo_users:
            keys.tokens[user] = tokens.add_token(Path(keys.token_file), user, ["user"])
        agent_port = free_port()
        rm = rm_process_factory(
            *FLAGS,
            f"--tls-cert={keys.path('server', 'crt')}",
            f"--tls-key={keys.path('server', 'key')}",
            f"--tls-client-ca={keys.ca}",
            f"--agent-listen=127.0.0.1:{agent_port}",
            f"--tls-issuer-cert={keys.ca}",
            f"--tls-issuer-key={keys.path('ca', 'key')}",
            f"--token-file={keys.token_file}",
            "--ec-cert-hours=1",
            url=url,
        )
        rm.tls_ca = keys.ca
        await asyncio.to_thread(rm.start)
        cluster = Cluster(rm, keys, agent_port)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        for client in cluster.clients:
            await client.close()


async def judged_after(c: Cluster, resumed: datetime, ec: Any = None, agents: int = 1) -> Any:
    """Wait for a pass of the liveness judge one expiry after `resumed` and past the grace
    windows it announces, failing at once should agent1..`agents` or the EngineConn `ec`
    be condemned meanwhile; the judge's state (GetClusterInfo's `liveness`) then."""
    admin = c.client("root")

    async def passed() -> Any:
        if ec is not None:
            got = await admin.get_engine_conn(ec.engine_conn_id)
            assert got.state in LIVE, (
                f"EngineConn ended {ec_pb.EngineConnState.Name(got.state)}: {got.reason}\n"
                + log_tail(c.rm.log_path)
            )
        for i in range(1, agents + 1):
            ecm = await admin.get_ecm(f"agent{i}")
            assert ecm.state != rm_pb.ECM_STATE_LOST, f"agent{i} LOST\n" + log_tail(c.rm.log_path)
        judge = (await admin.get_cluster_info()).liveness
        due = max(
            resumed + timedelta(seconds=EXPIRY),
            ts(judge.agents_judged_from),
            ts(judge.engine_conns_judged_from),
        )
        return (
            judge if judge.HasField("last_pass_time") and ts(judge.last_pass_time) > due else None
        )

    return await wait_until(
        passed, timeout=6 * EXPIRY, what="a liveness pass past the grace windows", interval=0.2
    )


async def still_works(c: Cluster, ec: Any) -> None:
    """The agent beats, the EngineConn is IDLE on it and runs code for its user."""
    admin = c.client("root")
    assert (await admin.get_ecm("agent1")).state == rm_pb.ECM_STATE_RUNNING
    got = await admin.get_engine_conn(ec.engine_conn_id)
    assert got.state == ec_pb.ENGINE_CONN_STATE_IDLE and got.ecm_instance == "agent1"
    items = [item async for item in c.client("lrmtest_a").execute(ec, "echo alive")]
    assert items == [ExecOutput("stdout", "alive\n"), ExecResult(0, False, "")]


async def test_a_paused_rm_condemns_no_agent_and_no_engineconn(make_cluster, agent_factory):
    c = await make_cluster()
    await c.start_agent(agent_factory, "agent1")
    ec = await c.start_engineconn()
    stopped_at = datetime.now(UTC)
    # The whole RM: its users' process and the agents' process it started (which hears
    # the agents; a pause of the users' process alone costs them nothing,
    # tests/integration/test_agent_process.py).
    paused = [c.rm.proc.pid, *(p.pid for p in psutil.Process(c.rm.proc.pid).children())]
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(OUTAGE)  # the pause itself
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
    judge = await judged_after(c, datetime.now(UTC), ec)
    assert ts(judge.heard_since) > stopped_at
    assert "stalled" in judge.heard_since_reason, judge.heard_since_reason
    await still_works(c, ec)


async def test_a_restart_after_twice_the_expiry_condemns_nobody(make_cluster, agent_factory):
    c = await make_cluster()
    await c.start_agent(agent_factory, "agent1")
    ec = await c.start_engineconn()
    c.rm.kill()  # kill -9
    killed_at = datetime.now(UTC)
    await asyncio.sleep(OUTAGE)  # the outage itself
    await asyncio.to_thread(c.rm.start)
    judge = await judged_after(c, datetime.now(UTC), ec)
    assert ts(judge.heard_since) > killed_at
    assert "started" in judge.heard_since_reason, judge.heard_since_reason
    await still_works(c, ec)


async def test_agents_are_back_within_the_grace_window_after_a_long_outage(
    make_cluster, agent_factory
):
    """Over a long outage gRPC's own reconnect backoff grows towards two minutes: an agent
    must still reach the restarted RM within the grace window it gets."""
    c = await make_cluster()
    await c.start_agent(agent_factory, "agent1")
    c.rm.kill()
    await asyncio.sleep(LONG_OUTAGE)  # the outage itself
    await asyncio.to_thread(c.rm.start)
    await judged_after(c, datetime.now(UTC))
    assert (await c.client("root").get_ecm("agent1")).state == rm_pb.ECM_STATE_RUNNING


async def test_a_database_restart_condemns_nobody(make_cluster, agent_factory, own_postgres):
    c = await make_cluster(url=own_postgres.url)
    await c.start_agent(agent_factory, "agent1")
    ec = await c.start_engineconn()
    started_before = own_postgres.postmaster_start()
    stopped_at = datetime.now(UTC)
    await asyncio.to_thread(own_postgres.stop)
    await asyncio.sleep(OUTAGE)  # the outage itself
    await asyncio.to_thread(own_postgres.start)
    judge = await judged_after(c, datetime.now(UTC), ec)
    assert own_postgres.postmaster_start() != started_before  # it really restarted
    assert ts(judge.heard_since) > stopped_at
    assert "database" in judge.heard_since_reason, judge.heard_since_reason
    await still_works(c, ec)


async def test_an_agent_that_dies_is_still_lost(make_cluster, agent_factory):
    """The control: the RM heard all along, so a killed agent is LOST one expiry after
    its last beat, and its EngineConn with it."""
    c = await make_cluster()
    agent = await c.start_agent(agent_factory, "agent1")
    ec = await c.start_engineconn()
    agent.kill()  # kill -9; its EngineConn runs on and reports
    admin = c.client("root")

    async def lost() -> bool:
        return bool((await admin.get_ecm("agent1")).state == rm_pb.ECM_STATE_LOST)

    async def ended() -> Any:
        got = await admin.get_engine_conn(ec.engine_conn_id)
        return got if got.state not in LIVE else None

    await wait_until(lost, timeout=6 * EXPIRY, what="agent1 LOST", interval=0.2)
    # Its EngineConns end in transactions of their own, right after the ECM's.
    got = await wait_until(ended, timeout=EXPIRY, what="its EngineConn ended", interval=0.2)
    assert got.state == ec_pb.ENGINE_CONN_STATE_LOST and got.reason == "its ECM was lost"
    judge = (await admin.get_cluster_info()).liveness
    assert not judge.disrupted


async def test_agents_falling_silent_together_are_a_disruption_not_lost(
    make_cluster, agent_factory, capsys
):
    """All three agents stop at once (as behind a broken network): the judge suspects
    a disruption, says so in its log, GetClusterInfo and `rmctl status`, and declares
    none LOST; once they beat again the disruption ends, and still none is LOST."""
    from rmctl import main as rmctl

    c = await make_cluster()
    agents = [await c.start_agent(agent_factory, f"agent{i}") for i in (1, 2, 3)]
    admin = c.client("root")
    for agent in agents:
        os.kill(agent.proc.pid, signal.SIGSTOP)
    try:
        stopped_at = datetime.now(UTC)
        await asyncio.sleep(OUTAGE)  # the silence itself

        async def states() -> list[int]:
            return [(await admin.get_ecm(f"agent{i}")).state for i in (1, 2, 3)]

        assert await states() == [rm_pb.ECM_STATE_RUNNING] * 3, log_tail(c.rm.log_path)
        judge = (await admin.get_cluster_info()).liveness
        assert judge.disrupted and ts(judge.disrupted_since) > stopped_at
        assert (judge.silent_agents, judge.agents) == (3, 3)
        argv = ["--rm", c.rm.target, "--tls-ca", c.keys.ca, "--token", c.keys.tokens["root"]]
        capsys.readouterr()
        assert await asyncio.to_thread(rmctl, [*argv, "status"]) == 0
        status = details(capsys.readouterr().out, head_only=True)["liveness"]
        assert status.startswith("SUSPENDED since") and "3 of 3 agents silent" in status, status
    finally:
        for agent in agents:
            os.kill(agent.proc.pid, signal.SIGCONT)

    async def over() -> Any:
        judge = (await admin.get_cluster_info()).liveness
        return not judge.disrupted and judge

    await wait_until(over, timeout=6 * EXPIRY, what="the disruption over", interval=0.2)
    judge = await judged_after(c, datetime.now(UTC), agents=3)
    assert not judge.disrupted
    log = c.rm.log_path.read_text()
    assert log.count("suspected disruption began") == 1, log_tail(c.rm.log_path)
    assert log.count("suspected disruption ended") == 1, log_tail(c.rm.log_path)
