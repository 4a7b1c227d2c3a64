"""The liveness judge in one process with an injected clock (real gRPC, real PostgreSQL):
the grace window after a pause of the RM and after a takeover, and the suspected
disruption (one log line per episode, GetClusterInfo, the metrics, the node lists that
let an operator say which agents are really gone). The same with real processes, real
agents and EngineConns: test_liveness.py."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from labelrm.v1 import admin_pb2
from labelrm.v1 import resource_manager_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from rm_server.clock import ManualClock
from tests.support.messages import GiB, load_instance, register
from tests.support.rm import InProcessRM, start_in_process, stop_in_process
from tests.support.sdk import ctl, details

EXPIRY = 30.0  # the default ecm_expiry and ec_expiry
AGENTS = ("a1:9000", "a2:9000", "a3:9000", "a4:9000", "a5:9000")


@pytest.fixture
async def rm_paused(database_url: str) -> AsyncIterator[InProcessRM]:
    """An RM on a ManualClock whose hearing is checked every second (real time), so a
    `pause` of its clock is a stall it notices."""
    server = await start_in_process(database_url, clock=ManualClock(), sweep_interval=1.0)
    try:
        yield server
    finally:
        await stop_in_process(server)


async def beat(rm: InProcessRM, agent: str, seq: int) -> None:
    answer = await rm.rm.Heartbeat(pb.HeartbeatRequest(agent_id=agent, sequence=seq), timeout=10)
    assert answer.action == pb.HEARTBEAT_ACTION_CONTINUE, answer


async def states(rm: InProcessRM) -> dict[str, int]:
    listed = await rm.rm.ListEcms(pb.ListEcmsRequest(), timeout=10)
    return {e.instance: e.state for e in listed.ecms}


async def judge(rm: InProcessRM) -> Any:
    return (await rm.admin.GetClusterInfo(admin_pb2.GetClusterInfoRequest())).liveness


async def gauges(rm: InProcessRM) -> dict[str, float]:
    """The labelrm_liveness_* samples of a scrape read afresh (not from the cache a
    scrape keeps for two seconds)."""
    metrics = rm.server.metrics
    assert metrics is not None and metrics.liveness is not None
    metrics.liveness.expire()
    text = (await metrics.exposition()).decode()
    return {
        sample.name + "".join(f"{{{v}}}" for v in sample.labels.values()): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("labelrm_liveness")
        for sample in family.samples
    }


LOST, RUNNING = pb.ECM_STATE_LOST, pb.ECM_STATE_RUNNING


async def test_a_pause_of_the_rm_gives_every_agent_a_fresh_grace_window(rm_paused, capsys):
    rm = rm_paused
    await rm.rm.RegisterEcm(register(AGENTS[0], load_instance(GiB, 1000, 1)), timeout=10)
    rm.clock.pause(4 * EXPIRY)  # the RM stopped: no beat reached it
    await rm.server.hub.sweep()
    assert (await states(rm))[AGENTS[0]] == RUNNING
    state = await judge(rm)
    assert state.heard_since_reason.startswith("rm-server was stalled for 1")
    assert state.heard_since.ToDatetime() == rm.clock.now().replace(tzinfo=None)
    assert await ctl(rm, "status") == 0
    shown = details(capsys.readouterr().out, head_only=True)["liveness"]
    assert shown.startswith("grace window until") and "stalled" in shown, shown
    # The window is one expiry, not forever: silent through all of it, the agent is LOST.
    rm.clock.advance(EXPIRY + 1)
    await rm.server.hub.sweep()
    assert (await states(rm))[AGENTS[0]] == LOST


async def test_a_judge_taking_over_gives_a_grace_window(rm_manual_clock):
    rm = rm_manual_clock
    await rm.rm.RegisterEcm(register(AGENTS[0], load_instance(GiB, 1000, 1)), timeout=10)
    await rm.server.hub.sweep()
    rm.clock.advance(EXPIRY + 1)
    # Another replica judged last (it died; its agents must find their way here).
    await rm.core.db.run(lambda c: c.execute("UPDATE liveness SET judge = 'rm-elsewhere'"))
    await rm.server.hub.sweep()
    assert (await states(rm))[AGENTS[0]] == RUNNING
    state = await judge(rm)
    assert state.heard_since_reason == "this replica took over the liveness judge from rm-elsewhere"
    rm.clock.advance(EXPIRY + 1)
    await rm.server.hub.sweep()
    assert (await states(rm))[AGENTS[0]] == LOST


async def test_most_agents_silent_at_once_are_a_suspected_disruption(rm_manual_clock, caplog):
    rm = rm_manual_clock
    hub = rm.server.hub
    seq = dict.fromkeys(AGENTS, 0)
    for agent in AGENTS:
        await rm.rm.RegisterEcm(register(agent, load_instance(GiB, 1000, 1)), timeout=10)

    async def beats(*agents: str) -> None:
        for agent in agents:
            seq[agent] += 1
            await beat(rm, agent, seq[agent])

    await beats(*AGENTS)
    assert (await gauges(rm))["labelrm_liveness_disrupted"] == 0
    # a1..a3 fall silent together, a4 and a5 beat on: 3 of 5 silent past half the expiry.
    for _ in range(3):
        rm.clock.advance(EXPIRY / 3 + 1)
        await beats(*AGENTS[3:])
    with caplog.at_level(logging.WARNING, logger="rm_server.app.liveness"):
        for _ in range(3):
            await hub.sweep()
            rm.clock.advance(1)
    assert set((await states(rm)).values()) == {RUNNING}
    state = await judge(rm)
    assert state.disrupted and (state.silent_agents, state.agents) == (3, 5)
    began = [r.getMessage() for r in caplog.records if "disruption began" in r.getMessage()]
    assert len(began) == 1 and "3 of 5 agents silent at once" in began[0], began
    samples = await gauges(rm)
    assert samples["labelrm_liveness_disrupted"] == 1
    assert samples["labelrm_liveness_silent_agents"] == 3
    # The operator knows a1 is gone for good: excluded, it alone is LOST.
    await rm.admin.RefreshNodes(admin_pb2.RefreshNodesRequest(exclude=["a1"]))
    await hub.sweep()
    assert await states(rm) == {AGENTS[0]: LOST} | dict.fromkeys(AGENTS[1:], RUNNING)
    # a2 beats again; a3 never does: 1 of 4 silent, the disruption is over and everyone
    # gets a fresh grace window, through which a3 stays silent: LOST (a single dead agent).
    await beats(*AGENTS[1:2], *AGENTS[3:])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rm_server.app.liveness"):
        await hub.sweep()
    assert any("suspected disruption ended" in r.getMessage() for r in caplog.records)
    assert not (await judge(rm)).disrupted
    assert (await gauges(rm))["labelrm_liveness_disrupted"] == 0
    assert (await states(rm))[AGENTS[2]] == RUNNING  # in its grace window
    for _ in range(4):
        rm.clock.advance(EXPIRY / 3)
        await beats(*AGENTS[1:2], *AGENTS[3:])
        await hub.sweep()
    assert await states(rm) == {
        AGENTS[0]: LOST,
        AGENTS[1]: RUNNING,
        AGENTS[2]: LOST,
    } | dict.fromkeys(AGENTS[3:], RUNNING)
