"""Real agents, started and waited for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from labelrm.v1 import (
    resource_manager_pb2,
)

from tests.support.rm import InProcessRM
from tests.support.waiting import wait_until


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
