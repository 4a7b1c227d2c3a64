"""No request costs a real, secured rm-server more than a bounded amount, checked before
the work: the attacks of a tenant and of a network peer, run as written against an
rm-server process with TLS and tokens on (and, where it matters, the mutual-TLS agent
listener), each with the state or behaviour it must not change: the RM's peak memory,
that its Python layer never saw the bytes, that the refusal names the limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from labelrm.v1 import demand_pb2 as dpb
from labelrm.v1 import resource_manager_pb2 as pb

from rm_server.domain.demands.timelang import MAX_INTERVALS
from tests.integration.security_fixtures import (
    Pki,
    SecuredProcess,
    Stubs,
    make_pki,
    start_secured_process,
)
from tests.support.messages import GiB, lbl, load, load_instance, register

ALICE = "userCreator=alice-IDE,engineType=spark-3.2.1"
HEARTBEAT = "/labelrm.v1.ResourceManagerService/Heartbeat"
GET_LABEL = "/labelrm.v1.ResourceManagerService/GetLabelResource"
# Two million empty EngineConn reports: 4,194,240 bytes, under the 4 MiB message limit.
EMPTY_REPORTS = b"\x1a\x00" * 2_097_120
MiB = 1 << 20


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("bounded-pki"))


@pytest.fixture
async def secured(rm_process_factory, keys) -> AsyncIterator[Callable[..., SecuredProcess]]:
    """Starts secured rm-server processes (`start_secured_process`), closes their channels."""
    started: list[SecuredProcess] = []

    def start(*, agents: bool = True) -> SecuredProcess:
        rm = start_secured_process(rm_process_factory, keys, agents=agents)
        started.append(rm)
        return rm

    yield start
    for rm in started:
        await rm.close()


def raw(channel: grpc.aio.Channel, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
    """A call of `method` that sends the bytes it is given, as they are."""
    return channel.unary_unary(method)


async def serving(rm: SecuredProcess) -> bool:
    health = health_pb2_grpc.HealthStub(rm.channel())
    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def bad_request_field(err: grpc.aio.AioRpcError) -> str:
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                    bad = error_details_pb2.BadRequest()
                    detail.Unpack(bad)
                    return str(bad.field_violations[0].field)
    return ""


# ----- anonymous bytes cost nothing -----------------------------------------------------------


@pytest.mark.parametrize("agents", [True, False], ids=["agent-listener", "one-listener"])
async def test_anonymous_megabytes_are_refused_unread(secured, agents):
    """Four anonymous 4 MiB Heartbeat bodies of two million empty reports, at once, to
    the users' listener. Today they were parsed and walked before the refusal (the RM
    grew from ~100 to ~950 MiB; its health check took 17-32 s)."""
    rm = secured(agents=agents)
    stranger = raw(rm.channel(), HEARTBEAT)
    before = rm.memory()
    results = await asyncio.gather(
        *(stranger(EMPTY_REPORTS, timeout=60) for _ in range(4)),
        serving(rm),
        return_exceptions=True,
    )
    *refusals, health = results
    assert health is True, health
    for refusal in refusals:
        assert isinstance(refusal, grpc.aio.AioRpcError), refusal
        if agents:  # the users' listener takes user-sized messages: gRPC drops it unread
            assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refusal
        else:  # one listener takes agents' large beats: refused on the caller, unread
            assert refusal.code() == grpc.StatusCode.UNAUTHENTICATED, refusal
    # Parsing one of them took ~210 MiB (and walking it a second of CPU); refused
    # before the parse, they leave the peak where it was.
    assert rm.memory("VmHWM") - before < 64 * MiB
    # A user's token is no better: an agent's method is not theirs, whatever they send.
    if not agents:
        alice = raw(rm.channel("alice"), HEARTBEAT)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice(EMPTY_REPORTS, timeout=60)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "needs role agent" in (err.value.details() or "")
        assert rm.memory("VmHWM") - before < 64 * MiB
    assert rm.rpc_count(HEARTBEAT[1:]) == (0 if agents else 5)  # refused calls, none served


async def test_an_agents_two_million_reports_are_counted_before_any_walk(secured, keys):
    """An authenticated agent's beat of two million empty reports: refused on its count,
    before the NUL walk, the policy or the servicer looked at one."""
    rm = secured(agents=True)
    channel = rm.channel(cert=keys.cert("agent", "agent1"), agent=True)
    await Stubs(channel).rm.RegisterEcm(register("agent1", load_instance(GiB, 1000, 1)))
    beat = b"\x0a\x06agent1\x10\x01" + EMPTY_REPORTS[:-10]  # agent_id, sequence, reports
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await raw(channel, HEARTBEAT)(beat, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(err.value) == "engine_conns"
    assert "too many entries: 2097115 > 10000" in (err.value.details() or "")


# ----- refused large user requests never reach Python ------------------------------------------


async def test_oversized_user_requests_are_dropped_by_the_transport(secured):
    """A user's 4 MiB GetLabelResource on the users' listener: gRPC itself refuses it
    (the listener takes user-sized messages), so no byte of it reaches the RM's Python:
    no call is counted. Today it was received whole and refused by the interceptor."""
    rm = secured(agents=True)
    admin = Stubs(rm.channel("root"))
    await admin.rm.RegisterEcm(register("host1:9000", load_instance(8 * GiB, 8000, 8)))
    alice = Stubs(rm.channel("alice"))
    asked = pb.GetLabelResourceRequest(labels=lbl("emInstance=host1:9000"))
    await alice.rm.GetLabelResource(asked, timeout=10)
    counted = rm.rpc_count(GET_LABEL[1:])
    assert counted == 1
    huge = pb.GetLabelResourceRequest(labels=lbl("emInstance=host1:9000"))
    huge.labels[0].value += "x" * (4 * MiB - 4096)
    for _ in range(4):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await alice.rm.GetLabelResource(huge, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert rm.rpc_count(GET_LABEL[1:]) == counted
    assert await serving(rm)


# ----- the time language's limits, on a real RM -------------------------------------------------


def attack_window(intervals: int) -> str:
    """The observed attack: ``intervals`` spans in nested ORs of 64 (4,096: 64 groups of
    64, ~61,000 characters, inside every limit the language had before)."""
    spans = [f"[+{2 * k}m, +1m]" for k in range(intervals)]
    groups = ["{OR: [" + ", ".join(spans[i : i + 64]) + "]}" for i in range(0, intervals, 64)]
    return "{Start: {OR: [" + ", ".join(groups) + "]}}"


def attack_structure(intervals: int) -> dpb.TimeConditions:
    """The same window in the structured form."""
    groups = []
    for g in range(0, intervals, 64):
        spans = [
            dpb.TimeExpression(
                interval=dpb.TimeInterval(
                    begin=dpb.TimePoint(relative={"seconds": 120 * k}),
                    end=dpb.TimePoint(relative={"seconds": 60}),
                )
            )
            for k in range(g, min(g + 64, intervals))
        ]
        groups.append(dpb.TimeExpression(any_of=dpb.TimeExpressionList(expressions=spans)))
    window = dpb.TimeExpression(any_of=dpb.TimeExpressionList(expressions=groups))
    return dpb.TimeConditions(start=dpb.StartCondition(time=window))


async def test_a_demand_of_4096_intervals_is_refused_naming_the_limit(secured):
    """Today it was admitted after seconds of evaluation, then froze the RM for 37-70 s
    on every planner round."""
    rm = secured(agents=True)
    admin = Stubs(rm.channel("root"))
    await admin.rm.RegisterEcm(register("host1:9000", load_instance(8 * GiB, 8000, 8)))
    alice = Stubs(rm.channel("alice"))
    labels = lbl(ALICE + ",emInstance=host1:9000")
    text = attack_window(4096)
    assert len(text) < 64 * 1024
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await alice.demands.SubmitDemand(
            dpb.SubmitDemandRequest(
                demand_id="big", labels=labels, resource=load(GiB, 1000), time_conditions_text=text
            ),
            timeout=60,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(err.value) == "time_conditions_text"
    assert f"at most {MAX_INTERVALS} intervals in a start window" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await alice.demands.SubmitDemand(
            dpb.SubmitDemandRequest(
                demand_id="big-structured",
                labels=labels,
                resource=load(GiB, 1000),
                time_conditions=attack_structure(4096),
            ),
            timeout=60,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(err.value).startswith("time_conditions.start.time.any_of")
    assert f"at most {MAX_INTERVALS} intervals" in (err.value.details() or "")
    # The largest window the limits allow is admitted, and the RM goes on serving.
    largest = await alice.demands.SubmitDemand(
        dpb.SubmitDemandRequest(
            demand_id="largest",
            labels=labels,
            resource=load(GiB, 1000),
            time_conditions_text=attack_window(MAX_INTERVALS),
        ),
        timeout=60,
    )
    assert largest.demand.state == dpb.DEMAND_STATE_ACCEPTED
    assert await serving(rm)
    listed = await alice.demands.ListDemands(dpb.ListDemandsRequest(), timeout=10)
    assert [d.demand_id for d in listed.demands] == ["largest"]
