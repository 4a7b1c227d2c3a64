"""The console's overview counts the cluster's totals as `rmctl status` does: the capacity
of the nodes that are there. A LOST node's capacity was summed in (its record stays, with
its maximum, until the node comes back or is decommissioned)."""

from __future__ import annotations

from typing import Any

from labelrm_client import AsyncRMClient, load_instance
from tests.integration.console_fixtures import get
from tests.support.agents import start_agent
from tests.support.env import ENGINECONN_TEST_SETTINGS
from tests.support.rm import start_in_process, stop_in_process
from tests.support.waiting import wait_until


async def test_the_overview_leaves_lost_nodes_out_of_the_totals(
    database_url: str, agent_factory: Any
) -> None:
    rm = await start_in_process(
        database_url, console_listen="127.0.0.1:0", console_refresh=0.2,
        **ENGINECONN_TEST_SETTINGS,
    )  # fmt: skip
    try:
        await start_agent(rm, agent_factory)
        async with AsyncRMClient(rm.target, timeout=10.0) as client:
            await client.register_ecm("ghost:1", load_instance(64 << 30, 32000, 64))  # never beats
            agent = await client.get_ecm("agent1")
        agent_memory = agent.total_resource.load_instance.memory_bytes

        async def overview() -> dict[str, Any]:
            status, body = await get(rm, "/api/overview")
            assert status == 200, body
            return dict(body)

        async def ghost_lost() -> bool:
            return bool((await overview())["nodes"].get("LOST") == 1)

        await wait_until(ghost_lost, 30, what="ghost:1 LOST in the overview", interval=0.5)
        body = await overview()
        assert body["nodes"] == {"LOST": 1, "RUNNING": 1}
        assert body["totals"]["memory_bytes"]["max"] == agent_memory
    finally:
        await stop_in_process(rm)
