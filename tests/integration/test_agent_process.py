"""User traffic cannot delay liveness: with `agent_listen`, a real rm-server serves the
agents, and judges their liveness, from a process of its own (rm_server.agent_process).
Shown on a secured RM: the agents' process answers heartbeats while the users' process
does nothing at all (SIGSTOP: the extreme of a users' process stalled by its load), it
is started again when it dies, and it ends with the users' process."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from labelrm.v1 import resource_manager_pb2 as pb

from tests.integration.security_fixtures import (
    Pki,
    SecuredProcess,
    Stubs,
    make_pki,
    start_secured_process,
)
from tests.support.messages import GiB, load_instance, register
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("agent-process-pki"))


@pytest.fixture
async def rm(rm_process_factory, keys) -> AsyncIterator[SecuredProcess]:
    secured = start_secured_process(rm_process_factory, keys, agents=True)
    try:
        yield secured
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever the test left it in
            os.kill(secured.pid, signal.SIGCONT)
        await secured.close()


def agents_process(rm: SecuredProcess) -> psutil.Process | None:
    """The users' process's child serving agent_listen, if one runs."""
    for child in psutil.Process(rm.pid).children():
        try:
            if "rm_server.agent_process" in child.cmdline():
                return child
        except psutil.NoSuchProcess:
            continue
    return None


class Agent:
    """agent1, by its certificate, on the agents' listener."""

    def __init__(self, rm: SecuredProcess, keys: Pki) -> None:
        channel = rm.channel(cert=keys.cert("agent", "agent1"), agent=True)
        self.stubs = Stubs(channel)
        self.health = health_pb2_grpc.HealthStub(channel)
        self.sequence = 0

    async def register(self) -> None:
        await self.stubs.rm.RegisterEcm(register("agent1", load_instance(GiB, 1000, 1)))

    async def beat(self, timeout: float = 10.0) -> pb.HeartbeatResponse:
        self.sequence += 1
        request = pb.HeartbeatRequest(agent_id="agent1", sequence=self.sequence)
        answer: pb.HeartbeatResponse = await self.stubs.rm.Heartbeat(request, timeout=timeout)
        return answer


async def test_agents_are_served_and_judged_while_the_users_process_stands_still(rm, keys):
    agent = Agent(rm, keys)
    await agent.register()
    assert (await agent.beat()).action == pb.HEARTBEAT_ACTION_CONTINUE
    os.kill(rm.pid, signal.SIGSTOP)  # the users' process answers nothing now
    try:
        for _ in range(3):
            assert (await agent.beat()).action == pb.HEARTBEAT_ACTION_CONTINUE
        check = await agent.health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        os.kill(rm.pid, signal.SIGCONT)
    child = agents_process(rm)
    assert child is not None and child.pid != rm.pid
    # Which work ran where, as the one scrape of the users' process shows both: the
    # heartbeats and the liveness passes in the agents' process, none in the users'.
    text = rm.metrics()
    heartbeat = "labelrm.v1.ResourceManagerService/Heartbeat"
    assert rm.rpc_count(heartbeat, 'process="agents"') == 4
    passes = re.findall(r"^labelrm_background_pass_seconds_count{([^}]*)} (\S+)$", text, re.M)
    liveness = [(labels, float(n)) for labels, n in passes if 'job="liveness"' in labels]
    assert liveness and all('process="agents"' in labels for labels, _ in liveness)
    assert sum(n for _, n in liveness) > 0
    planner = [labels for labels, _ in passes if 'job="demand-planner"' in labels]
    assert planner and not any('process="agents"' in labels for labels in planner)


async def test_a_dead_agents_process_is_started_again(rm, keys):
    agent = Agent(rm, keys)
    await agent.register()
    first = agents_process(rm)
    assert first is not None
    first.kill()

    async def serving_again() -> bool:
        replaced = agents_process(rm)
        if replaced is None or replaced.pid == first.pid:
            return False
        try:
            await agent.beat(timeout=2)
        except grpc.aio.AioRpcError:
            agent.sequence -= 1  # not answered: the same beat again
            return False
        return True

    await wait_until(serving_again, 60, what="a new agents' process answering heartbeats")


async def test_the_agents_process_ends_with_the_users_process(rm):
    child = agents_process(rm)
    assert child is not None
    rm.proc.kill()  # kill -9: no chance to stop its child

    async def gone() -> bool:
        return not child.is_running() or child.status() == psutil.STATUS_ZOMBIE

    await wait_until(gone, 30, what="the agents' process gone with the users' process")
