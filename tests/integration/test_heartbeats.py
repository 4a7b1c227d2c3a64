"""Agent heartbeats on the RM, grouped: many agents' beats share one transaction, and
each still gets its own answer (resends, commands, node lists, LOST, fencing)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from labelrm.v1 import admin_pb2
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from rm_server.domain.engineconn import AgentCommand, CommandKind
from rm_server.store import engineconns as ec_store
from tests.support.messages import GiB, load_instance, register
from tests.support.rm import beat_on_stream

CONTINUE = pb.HEARTBEAT_ACTION_CONTINUE


async def _register(rm, agents: list[str]) -> None:
    for agent in agents:
        await rm.rm.RegisterEcm(register(agent, load_instance(8 * GiB, 8000, 8)), timeout=10)


def _beat(agent: str, seq: int, **fields) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(agent_id=agent, sequence=seq, **fields)


async def _queue(rm, agent: str, command_id: str, ec_id: str) -> None:
    command = AgentCommand(
        command_id, agent, ec_id, CommandKind.KILL, reason="test", grace_seconds=1.0
    )
    now = rm.clock.now()
    await rm.core.db.run(lambda c: ec_store.queue_command(c, command, now))


async def test_concurrent_beats_share_transactions_each_answered(rm_manual_clock):
    rm = rm_manual_clock
    agents = [f"host{i:02d}:9000" for i in range(40)]
    await _register(rm, agents)
    rm.clock.advance(5)
    beats = rm.server.hub._beat_combiner()
    groups_before, requests_before = beats.groups, beats.requests
    answers = await asyncio.gather(*(rm.rm.Heartbeat(_beat(a, 1), timeout=10) for a in agents))
    assert [(r.action, r.sequence) for r in answers] == [(CONTINUE, 1)] * 40
    assert all(r.heartbeat_interval.ToNanoseconds() > 0 for r in answers)
    assert beats.requests - requests_before == 40
    assert beats.groups - groups_before < 40, "no two heartbeats shared a transaction"
    listed = await rm.rm.ListEcms(pb.ListEcmsRequest(page_size=100), timeout=10)
    seen = {e.instance: e.last_heartbeat_time.ToDatetime() for e in listed.ecms}
    now = rm.clock.now().replace(tzinfo=None)
    assert all(seen[a] == now for a in agents), seen


async def test_resend_gets_the_first_answer_and_commands_until_acknowledged(rm_manual_clock):
    rm = rm_manual_clock
    await _register(rm, ["a1:9000"])
    await _queue(rm, "a1:9000", "cmd-one", "ec-gone-1")
    first = await rm.rm.Heartbeat(_beat("a1:9000", 1), timeout=10)
    assert [c.command_id for c in first.commands] == ["cmd-one"]
    assert first.commands[0].kill.engine_conn_id == "ec-gone-1"
    # The agent did not get the answer and sends the same beat again: same bytes back,
    # even after a new command was queued.
    await _queue(rm, "a1:9000", "cmd-two", "ec-gone-2")
    again = await rm.rm.Heartbeat(_beat("a1:9000", 1), timeout=10)
    assert again.SerializeToString() == first.SerializeToString()
    # The next beat acknowledges the first command: only the second is still pending.
    second = await rm.rm.Heartbeat(_beat("a1:9000", 2, done_command_ids=["cmd-one"]), timeout=10)
    assert [c.command_id for c in second.commands] == ["cmd-two"]
    pending = await rm.core.db.run(lambda c: ec_store.pending_commands(c, "a1:9000"))
    assert [c.command_id for c in pending] == ["cmd-two"]
    third = await rm.rm.Heartbeat(_beat("a1:9000", 3, done_command_ids=["cmd-two"]), timeout=10)
    assert list(third.commands) == []


async def test_unknown_excluded_and_lost_agents(rm_manual_clock):
    rm = rm_manual_clock
    await _register(rm, ["good:9000", "bad:9000", "quiet:9000"])
    await rm.admin.RefreshNodes(admin_pb2.RefreshNodesRequest(exclude=["bad"]), timeout=10)
    rm.clock.advance(20)
    answers = await asyncio.gather(
        rm.rm.Heartbeat(_beat("good:9000", 1), timeout=10),
        rm.rm.Heartbeat(_beat("bad:9000", 1), timeout=10),
        rm.rm.Heartbeat(_beat("nobody:9000", 1), timeout=10),
    )
    assert [r.action for r in answers] == [
        CONTINUE,
        pb.HEARTBEAT_ACTION_SHUTDOWN,
        pb.HEARTBEAT_ACTION_REREGISTER,
    ]
    assert "excluded" in answers[1].reason and "unknown" in answers[2].reason
    # quiet:9000 never beat: past the expiry it is LOST, good:9000 (beating on) not. (Had
    # good:9000 fallen silent too, three of three agents silent would be a suspected
    # disruption, and nobody LOST: test_liveness_judge.py.)
    rm.clock.advance(rm.server.hub.settings.ecm_expiry.total_seconds() - 10)
    assert (await rm.rm.Heartbeat(_beat("good:9000", 2), timeout=10)).action == CONTINUE
    await rm.server.hub.sweep()
    states = {
        e.instance: e.state for e in (await rm.rm.ListEcms(pb.ListEcmsRequest(), timeout=10)).ecms
    }
    assert states["quiet:9000"] == pb.ECM_STATE_LOST
    assert states["good:9000"] != pb.ECM_STATE_LOST
    lost = await rm.rm.Heartbeat(_beat("quiet:9000", 1), timeout=10)
    assert lost.action == pb.HEARTBEAT_ACTION_REREGISTER and "LOST" in lost.reason


async def test_a_beat_needing_the_full_pass_in_a_group_of_routine_ones(rm_manual_clock):
    """A process the RM does not know is fenced (a kill command) by the full pass, while
    the routine beats of the same group are answered in the group."""
    rm = rm_manual_clock
    agents = [f"n{i}:9000" for i in range(10)]
    await _register(rm, agents)
    stranger = ec_pb.EngineConnProcess(
        engine_conn_id="ec-unknown", state=ec_pb.PROCESS_STATE_RUNNING, pid=4242
    )
    requests = [_beat(a, 1) for a in agents]
    requests[3] = _beat(agents[3], 1, engine_conns=[stranger])
    answers = await asyncio.gather(*(rm.rm.Heartbeat(r, timeout=10) for r in requests))
    assert all(r.action == CONTINUE for r in answers)
    kills = [(c.kill.engine_conn_id, c.kill.reason) for c in answers[3].commands]
    assert kills == [("ec-unknown", "not recognised")]
    assert all(not r.commands for i, r in enumerate(answers) if i != 3)
    # Its answer was stored like any other: a resend gets it back verbatim.
    again = await rm.rm.Heartbeat(requests[3], timeout=10)
    assert again.SerializeToString() == answers[3].SerializeToString()


async def test_heartbeat_stream_answers_each_beat_as_heartbeat_does(rm_manual_clock):
    rm = rm_manual_clock
    await _register(rm, ["s1:9000"])
    await _queue(rm, "s1:9000", "cmd-one", "ec-gone-1")
    stream = rm.rm.HeartbeatStream(timeout=30)
    first = await beat_on_stream(stream, _beat("s1:9000", 1))
    assert first.action == CONTINUE and first.sequence == 1
    assert [c.command_id for c in first.commands] == ["cmd-one"]
    second = await beat_on_stream(stream, _beat("s1:9000", 2, done_command_ids=["cmd-one"]))
    assert second.sequence == 2 and list(second.commands) == []
    # The answer was lost with the stream: on a new stream the same beat gets the same
    # bytes, as a unary resend would; a unary call sees the same stored answer.
    stream.cancel()
    again_stream = rm.rm.HeartbeatStream(timeout=30)
    again = await beat_on_stream(again_stream, _beat("s1:9000", 2))
    assert again.SerializeToString() == second.SerializeToString()
    unary = await rm.rm.Heartbeat(_beat("s1:9000", 2), timeout=10)
    assert unary.SerializeToString() == second.SerializeToString()
    # An agent the RM does not know is told to register, on the stream as on a call.
    unknown = await beat_on_stream(again_stream, _beat("nobody:9000", 1))
    assert unknown.action == pb.HEARTBEAT_ACTION_REREGISTER
    await again_stream.done_writing()
    assert await again_stream.read() is grpc.aio.EOF
    assert await again_stream.code() == grpc.StatusCode.OK
    seq = await rm.core.db.run(
        lambda c: c.execute("SELECT heartbeat_seq FROM ecm WHERE instance = 's1:9000'")
    )
    assert (await seq.fetchone())[0] == 2


async def test_a_bad_beat_ends_the_stream_with_the_field_named(rm):
    await _register(rm, ["s2:9000"])
    stream = rm.rm.HeartbeatStream(timeout=30)
    ok = await beat_on_stream(stream, _beat("s2:9000", 1))
    assert ok.action == CONTINUE
    await stream.write(pb.HeartbeatStreamRequest(heartbeat=_beat("s2:9000", 0)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stream.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "heartbeat.sequence" in (err.value.details() or "")
    # Nothing was recorded for the refused beat; the agent beats on, on a new stream.
    again = await beat_on_stream(rm.rm.HeartbeatStream(timeout=30), _beat("s2:9000", 2))
    assert again.action == CONTINUE and again.sequence == 2


async def test_the_sweep_finds_every_silent_ecm_and_no_beating_one(rm_manual_clock):
    """The sweep reads ECMs through an index on a heartbeat mark that only every few
    beats renew: an ECM beating for many expiry periods stays alive, one that stops is
    LOST one expiry after its last beat, whatever the mark said."""
    rm = rm_manual_clock
    expiry = rm.server.hub.settings.ecm_expiry.total_seconds()
    await _register(rm, ["steady:9000", "stops:9000"])
    seq = 0
    for _ in range(int(4 * expiry / 3)):  # beats every 3 s for four expiry periods
        seq += 1
        await rm.rm.Heartbeat(_beat("steady:9000", seq), timeout=10)
        await rm.rm.Heartbeat(_beat("stops:9000", seq), timeout=10)
        rm.clock.advance(3)
        await rm.server.hub.sweep()
    # stops:9000 beats no more: alive until one expiry after its last beat, then LOST.
    for _ in range(int(expiry / 3) + 2):
        seq += 1
        await rm.rm.Heartbeat(_beat("steady:9000", seq), timeout=10)
        rm.clock.advance(3)
        await rm.server.hub.sweep()
    states = {
        e.instance: e.state for e in (await rm.rm.ListEcms(pb.ListEcmsRequest(), timeout=10)).ecms
    }
    assert states["stops:9000"] == pb.ECM_STATE_LOST
    assert states["steady:9000"] != pb.ECM_STATE_LOST


async def test_a_kill_is_queued_once_and_a_streamed_command_is_not_read_again(rm_manual_clock):
    rm = rm_manual_clock
    await _register(rm, ["a1:9000"])
    now = rm.clock.now()

    async def queue_kill(command_id: str) -> None:
        kill = AgentCommand(command_id, "a1:9000", "ec-x", CommandKind.KILL, reason="test")
        await rm.core.db.run(lambda c: ec_store.queue_command(c, kill, now, unless_pending=True))

    # A second kill for the same EngineConn while the first is pending is not queued.
    await queue_kill("kill-1")
    await queue_kill("kill-2")
    pending = await rm.core.db.run(lambda c: ec_store.pending_commands(c, "a1:9000"))
    assert [(c.command_id, c.reason) for c in pending] == [("kill-1", "test")]
    # Once acknowledged, a new kill is queued again.
    second = await rm.rm.Heartbeat(_beat("a1:9000", 1, done_command_ids=["kill-1"]), timeout=10)
    assert list(second.commands) == []
    await queue_kill("kill-3")
    # The command stream names the ones it sent: they come back without their payload.
    sent = await rm.core.db.run(lambda c: ec_store.pending_commands(c, "a1:9000", {"kill-3"}))
    assert [(c.command_id, c.kind, c.reason) for c in sent] == [("kill-3", CommandKind.KILL, "")]
