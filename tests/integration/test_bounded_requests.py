"""No request costs a real, secured rm-server more than a bounded amount, checked before
the work: the attacks of a tenant and of a network peer, run as written against an
rm-server process with TLS and tokens on (and, where it matters, the mutual-TLS agent
listener), each with the state or behaviour it must not change: the RM's peak memory,
that its Python layer never saw the bytes, that the refusal names the limit."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from labelrm.v1 import demand_pb2 as dpb
from labelrm.v1 import resource_manager_pb2 as pb

from clients._channel import ChannelSecurity, aio_channel
from rm_server.domain.demands.timelang import MAX_INTERVALS
from tests.fixtures.rm import RMProcess
from tests.helpers import GiB, free_port, lbl, load, load_instance, register
from tests.integration.security_fixtures import Pki, Stubs, make_pki

ALICE = "userCreator=alice-IDE,engineType=spark-3.2.1"
HEARTBEAT = "/labelrm.v1.ResourceManagerService/Heartbeat"
GET_LABEL = "/labelrm.v1.ResourceManagerService/GetLabelResource"
# Two million empty EngineConn reports: 4,194,240 bytes, under the 4 MiB message limit.
EMPTY_REPORTS = b"\x1a\x00" * 2_097_120
MiB = 1 << 20


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("bounded-pki"))


@dataclass
class Secured:
    """A real rm-server process with TLS and tokens, and channels to it."""

    proc: RMProcess
    keys: Pki
    agent_port: int = 0
    metrics_port: int = 0
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    def channel(
        self, token_of: str = "", cert: tuple[str, str] | None = None, agent: bool = False
    ) -> grpc.aio.Channel:
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

    def memory(self, key: str = "VmRSS") -> int:
        """The process's resident memory (VmRSS) or its peak so far (VmHWM), in bytes."""
        assert self.proc.proc is not None
        status = Path(f"/proc/{self.proc.proc.pid}/status").read_text()
        found = re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None, status
        return int(found.group(1)) * 1024

    def rpc_count(self, method: str) -> float:
        """Calls of `method` the RM's Python layer finished, by its metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        pattern = rf'^labelrm_rpc_total{{[^}}]*method="{re.escape(method)}"[^}}]*}} (\S+)$'
        return sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))


@pytest.fixture
async def secured(rm_process_factory, keys) -> AsyncIterator[Callable[..., Secured]]:
    """Starts secured rm-server processes: with the agent listener (``agents=True``) or
    with one listener for everyone, agents by token (``agents=False``)."""
    started: list[Secured] = []

    def start(*, agents: bool = True) -> Secured:
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
        proc = rm_process_factory(*args)
        proc.tls_ca = keys.ca
        proc.start()
        rm = Secured(proc, keys, agent_port if agents else 0, metrics_port)
        started.append(rm)
        return rm

    yield start
    for rm in started:
        for channel in rm.channels:
            await channel.close()


def raw(channel: grpc.aio.Channel, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
    """A call of `method` that sends the bytes it is given, as they are."""
    return channel.unary_unary(method)


async def serving(rm: Secured) -> bool:
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
