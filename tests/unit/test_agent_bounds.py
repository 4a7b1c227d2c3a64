"""What the agent keeps per EngineConn and per command stays bounded however many
launches it has carried out: an agent runs for months (bench.scale's agent-memory part
measures its RSS over thousands of launches; these check the structures themselves)."""

from __future__ import annotations

from pathlib import Path

from labelrm.v1 import engine_conn_pb2 as ec_pb

from ecm_agent.agent import SEEN_COMMANDS, Agent, _Process
from ecm_agent.forkserver import _KEPT_EXITS, ForkServer
from ecm_agent.settings import AgentSettings
from ecm_agent.validate import AgentPolicy
from labelrm_common import forkserver_wire as wire


def _cleanup(n: int, ec_id: str) -> ec_pb.AgentCommand:
    return ec_pb.AgentCommand(
        command_id=f"cmd-{n}", cleanup=ec_pb.CleanupCommand(engine_conn_id=ec_id)
    )


async def test_commands_and_ended_engineconns_are_forgotten(tmp_path: Path) -> None:
    settings = AgentSettings(rm="127.0.0.1:1", agent_id="bounds1", fork_servers=0)
    agent = Agent(settings, AgentPolicy(tmp_path / "work", tmp_path / "state", frozenset(), {}))
    try:
        for n in range(2 * SEEN_COMMANDS):
            ec_id = f"ec-{n}"
            # An EngineConn that ended and was reported; the RM then says to forget it.
            report = ec_pb.EngineConnProcess(
                engine_conn_id=ec_id, state=ec_pb.PROCESS_STATE_EXITED, exit_code=0
            )
            agent._processes[ec_id] = _Process(report, ended=True)
            await agent._execute(_cleanup(n, ec_id))
            assert len(agent._seen) <= SEEN_COMMANDS
        assert agent._processes == {}
        assert agent.launcher._tracked == {}
        # The commands carried out wait for the next heartbeat to acknowledge them (a
        # beat's answer empties the set; none is sent here).
        assert len(agent._done) == 2 * SEEN_COMMANDS
        # A command seen recently is still not carried out twice.
        agent._processes["ec-again"] = _Process(ec_pb.EngineConnProcess(engine_conn_id="ec-x"))
        await agent._execute(_cleanup(2 * SEEN_COMMANDS - 1, "ec-again"))
        assert "ec-again" in agent._processes
    finally:
        agent.beats.close()
        await agent.channel.close()


class _NoProcess:
    pid = 0
    returncode = None
    stdin = None
    stdout = None


async def test_a_fork_servers_exit_codes_are_bounded(tmp_path: Path) -> None:
    server = ForkServer("alice", 1000, "/py", tmp_path, _NoProcess())  # type: ignore[arg-type]
    for pid in range(2, 2 + 2 * _KEPT_EXITS):
        server._spawned.add(pid)
        server._dispatch(wire.Exit(pid, 0))
        assert len(server._exits) <= _KEPT_EXITS
    assert server._spawned == set()
    # The latest exits are the ones kept (an exit is asked for right after it happens).
    last = 1 + 2 * _KEPT_EXITS
    assert await server.exit_status(last) == 0
    assert last not in server._exits
