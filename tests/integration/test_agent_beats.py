"""The agent's heartbeat sender (ecm_agent/beats.py) over real gRPC: one stream for
many beats against the RM, unary calls against an RM without HeartbeatStream, and a new
stream after one ended under it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc

from ecm_agent.agent import RETRYABLE
from ecm_agent.beats import HeartbeatSender
from tests.support.messages import GiB, load_instance, register
from tests.support.waiting import wait_until

SERVICE = "labelrm.v1.ResourceManagerService"
CONTINUE = pb.HEARTBEAT_ACTION_CONTINUE


def _beat(seq: int, agent: str = "beats1:9000") -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(agent_id=agent, sequence=seq)


async def test_one_stream_carries_every_beat(rm):
    await rm.rm.RegisterEcm(register("beats1:9000", load_instance(4 * GiB, 4000, 4)))
    sender = HeartbeatSender(rm.rm, timeout=10)
    try:
        answers = [await sender.send(_beat(seq)) for seq in (1, 2, 3)]
    finally:
        sender.close()
    assert [(a.action, a.sequence) for a in answers] == [
        (CONTINUE, 1),
        (CONTINUE, 2),
        (CONTINUE, 3),
    ]
    assert sender.streams_opened == 1 and not sender.unary
    record = await rm.rm.GetEcm(pb.GetEcmRequest(instance="beats1:9000"))
    assert record.ecm.state == pb.ECM_STATE_RUNNING


async def _fake_rm(
    handlers: dict[str, grpc.RpcMethodHandler], port: int = 0
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    assert port in (0, bound), f"port {port} is not free again"
    await server.start()
    return server, bound


def _unary(calls: list[int]) -> grpc.RpcMethodHandler:
    async def heartbeat(request: pb.HeartbeatRequest, context: object) -> pb.HeartbeatResponse:
        calls.append(request.sequence)
        return pb.HeartbeatResponse(action=CONTINUE, sequence=request.sequence)

    return grpc.unary_unary_rpc_method_handler(
        heartbeat,
        request_deserializer=pb.HeartbeatRequest.FromString,
        response_serializer=pb.HeartbeatResponse.SerializeToString,
    )


def _stream(answers: int | None = None) -> grpc.RpcMethodHandler:
    """A HeartbeatStream answering each beat; with `answers`, the call then ends, OK, after
    that many (as an RM going away would)."""

    async def stream(
        requests: AsyncIterator[pb.HeartbeatStreamRequest], context: object
    ) -> AsyncIterator[pb.HeartbeatStreamResponse]:
        answered = 0
        async for request in requests:
            beat = request.heartbeat
            yield pb.HeartbeatStreamResponse(
                heartbeat=pb.HeartbeatResponse(action=CONTINUE, sequence=beat.sequence)
            )
            answered += 1
            if answered == answers:
                return

    return grpc.stream_stream_rpc_method_handler(
        stream,
        request_deserializer=pb.HeartbeatStreamRequest.FromString,
        response_serializer=pb.HeartbeatStreamResponse.SerializeToString,
    )


async def _with_fake(
    handlers: dict[str, grpc.RpcMethodHandler], body: Callable[[HeartbeatSender], object]
) -> None:
    server, port = await _fake_rm(handlers)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    sender = HeartbeatSender(resource_manager_pb2_grpc.ResourceManagerServiceStub(channel), 5)
    try:
        await body(sender)  # type: ignore[misc]
    finally:
        sender.close()
        await channel.close()
        await server.stop(None)


async def test_an_rm_without_the_stream_gets_calls():
    calls: list[int] = []

    async def body(sender: HeartbeatSender) -> None:
        first = await sender.send(_beat(1))
        second = await sender.send(_beat(2))
        assert (first.sequence, second.sequence) == (1, 2)
        # Tried once, then calls. Rarely gRPC's core ends the refused stream INTERNAL
        # under the first write: that beat goes as a call and the second beat's stream
        # meets the refusal.
        assert sender.unary and sender.streams_opened in (1, 2)

    await _with_fake({"Heartbeat": _unary(calls)}, body)
    assert calls == [1, 2]


async def test_a_stream_that_ended_is_replaced_and_the_beat_resent():
    async def body(sender: HeartbeatSender) -> None:
        assert (await sender.send(_beat(1))).sequence == 1
        # The RM ended that stream: the beat fails with a code the agent retries, ...
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sender.send(_beat(2))
        assert err.value.code() in RETRYABLE
        # ... and the retry opens a new stream.
        assert (await sender.send(_beat(2))).sequence == 2
        assert sender.streams_opened == 2 and not sender.unary

    await _with_fake({"HeartbeatStream": _stream(answers=1)}, body)


async def test_the_rm_restarting_under_an_open_stream_is_ridden_out():
    """The RM stops (its streams are cut) and comes back on the same port: the beat
    in between fails with a code the agent retries, the next goes on a new stream."""
    first_rm, port = await _fake_rm({"HeartbeatStream": _stream()})
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    sender = HeartbeatSender(resource_manager_pb2_grpc.ResourceManagerServiceStub(channel), 5)
    second_rm = None
    try:
        assert (await sender.send(_beat(1))).sequence == 1
        await first_rm.stop(None)
        second_rm, _ = await _fake_rm({"HeartbeatStream": _stream()}, port)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sender.send(_beat(2))
        assert err.value.code() in RETRYABLE
        answer = await asyncio.wait_for(_until_answered(sender, _beat(2)), 30)
        assert answer.sequence == 2 and not sender.unary
    finally:
        sender.close()
        await channel.close()
        if second_rm is not None:
            await second_rm.stop(None)


async def _until_answered(
    sender: HeartbeatSender, beat: pb.HeartbeatRequest
) -> pb.HeartbeatResponse:
    # As the agent's retry loop does (without its backoff): only retryable codes.
    async def answer() -> pb.HeartbeatResponse | None:
        try:
            return await sender.send(beat)
        except grpc.aio.AioRpcError as err:
            assert err.code() in RETRYABLE, err
            return None

    response: pb.HeartbeatResponse = await wait_until(answer, 60, what="the beat answered")
    return response


async def test_a_process_reported_while_a_beat_is_in_flight_goes_out_at_once(tmp_path):
    """A launch carried out while a heartbeat is under way (its process report not in
    that beat) is reported by the next beat at once, not an interval (here 600 s) later:
    until then the RM knows no pid or work dir for it."""
    from google.protobuf.duration_pb2 import Duration
    from labelrm.v1 import engine_conn_pb2 as ec_pb

    from ecm_agent.agent import Agent, _Process
    from ecm_agent.settings import AgentSettings
    from ecm_agent.validate import AgentPolicy

    beats: asyncio.Queue[pb.HeartbeatRequest] = asyncio.Queue()
    first_answered = asyncio.Event()

    async def heartbeat(request: pb.HeartbeatRequest, context: object) -> pb.HeartbeatResponse:
        await beats.put(request)
        if request.sequence == 1:
            await first_answered.wait()
        return pb.HeartbeatResponse(
            action=CONTINUE, sequence=request.sequence, heartbeat_interval=Duration(seconds=600)
        )

    handler = grpc.unary_unary_rpc_method_handler(
        heartbeat,
        request_deserializer=pb.HeartbeatRequest.FromString,
        response_serializer=pb.HeartbeatResponse.SerializeToString,
    )
    server, port = await _fake_rm({"Heartbeat": handler})
    settings = AgentSettings(rm=f"127.0.0.1:{port}", agent_id="beats3", fork_servers=0)
    policy = AgentPolicy(tmp_path / "work", tmp_path / "state", frozenset(), {})
    agent = Agent(settings, policy)
    loop = asyncio.ensure_future(agent._heartbeat_loop())
    try:
        first = await asyncio.wait_for(beats.get(), 30)
        assert list(first.engine_conns) == []
        # The launch is carried out while that beat waits for its answer (as `_launch` does).
        report = ec_pb.EngineConnProcess(
            engine_conn_id="ec-1", state=ec_pb.PROCESS_STATE_RUNNING, pid=4242, work_dir="/w"
        )
        agent._processes["ec-1"] = _Process(report)
        agent._report_now()
        first_answered.set()
        second = await asyncio.wait_for(beats.get(), 30)
        assert [(p.engine_conn_id, p.pid, p.work_dir) for p in second.engine_conns] == [
            ("ec-1", 4242, "/w")
        ]
    finally:
        agent.stop()
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await loop
        agent.beats.close()
        await agent.channel.close()
        await server.stop(None)
