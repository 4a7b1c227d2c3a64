"""The server's one interceptor (rm_server/service/interceptor.py) without a server:
handlers composed once, error statuses, metrics, the auth step, streaming calls."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pytest
from google.rpc import status_pb2
from labelrm.v1 import resource_manager_pb2 as pb
from prometheus_client import CollectorRegistry

from labelrm_common.roles import Role
from labelrm_common.tokens import TokenEntry
from rm_server.errors import NotFound, ResourceExhausted
from rm_server.observability.metrics import Metrics
from rm_server.security.interceptor import AuthInterceptor
from rm_server.security.limits import Limits, LimitSettings
from rm_server.security.tokens import TokenFile
from rm_server.service.errors import reason_of
from rm_server.service.interceptor import STATUS_DETAILS_KEY, Interceptor

RM = "labelrm.v1.ResourceManagerService"
APPLY = f"{RM}/Apply"


@dataclass
class Context:
    metadata: tuple[tuple[str, str], ...] = ()
    status: object = None
    details: str = ""
    trailing: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    written: list[Any] = field(default_factory=list)
    stalled: asyncio.Event | None = None  # set: each write waits forever (a stalled peer)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    async def write(self, message) -> None:
        self.written.append(message)
        if self.stalled is not None:
            self.stalled.set()
            await asyncio.Event().wait()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def auth_context(self) -> dict[str, Any]:
        return {}

    def code(self) -> object:
        return self.status

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self.trailing

    async def abort_with_status(self, status) -> None:
        self.status, self.details = status.code, status.details
        self.trailing = status.trailing_metadata
        raise grpc.aio.AbortError()

    def reason(self) -> str:
        for key, value in self.trailing:
            if key == STATUS_DETAILS_KEY:
                return reason_of(status_pb2.Status.FromString(value))
        return ""


class Details:
    def __init__(self, method: str) -> None:
        self.method = "/" + method
        self.invocation_metadata = ()


class Tokens:
    def find(self, token: str) -> tuple[str, TokenEntry] | None:
        if token != "alice-token":
            return None
        return "sha256:alice", TokenEntry("alice", frozenset({Role.USER}))


class Owners:
    async def ticket_owner(self, ticket_id: str) -> str | None:
        return "bob"

    async def engine_conn_owner(self, ec_id: str) -> str | None:
        return None


def interceptor(*, auth: bool = False, metrics: Metrics | None = None) -> Interceptor:
    guard = None
    if auth:
        limits = Limits(LimitSettings(apply_rate=0, max_waiting_applies=1))
        # Tokens stands in for a TokenFile: the interceptor only calls find().
        tokens = cast(TokenFile, Tokens())
        guard = AuthInterceptor(enabled=True, tokens=tokens, owners=Owners(), limits=limits)
    return Interceptor(auth=guard, metrics=metrics)


def composed(calls: Interceptor, method: str) -> Any:
    """The handler the interceptor composed for `method` (there must be one)."""
    handler = calls.service(Details(method))
    assert handler is not None, method
    return handler


def add(calls: Interceptor, method: str, handler: grpc.RpcMethodHandler) -> None:
    service, name = method.split("/")
    calls.add_registered_method_handlers(service, {name: handler})


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_handlers_are_composed_once_and_unknown_methods_are_left_to_grpc():
    calls = interceptor()

    async def apply(request, context):
        return "ok"

    add(calls, APPLY, grpc.unary_unary_rpc_method_handler(apply))
    first = composed(calls, APPLY)
    assert calls.service(Details(APPLY)) is first
    assert await composed(calls, APPLY).unary_unary(pb.ApplyRequest(), Context()) == "ok"
    assert calls.service(Details(f"{RM}/Nope")) is None
    # A method only a generic handler knows is composed on its first call, then kept.
    generic = grpc.method_handlers_generic_handler(
        "x.Other", {"Get": grpc.unary_unary_rpc_method_handler(apply)}
    )
    calls.add_generic_rpc_handlers((generic,))
    found = calls.service(Details("x.Other/Get"))
    assert found is not None and calls.service(Details("x.Other/Get")) is found


def test_install_registers_the_hot_methods_and_serves_the_rest_through_the_fallback():
    calls = interceptor()

    async def apply(request, context):
        return "ok"

    add(calls, APPLY, grpc.unary_unary_rpc_method_handler(apply))
    add(calls, f"{RM}/GetTicket", grpc.unary_unary_rpc_method_handler(apply))

    class Server:
        registered: dict[str, Any] = {}
        generic: tuple[Any, ...] = ()

        def add_registered_method_handlers(self, service, handlers):
            self.registered[service] = handlers

        def add_generic_rpc_handlers(self, handlers):
            self.generic = tuple(handlers)

    server = Server()
    calls.install(server)
    assert server.registered == {RM: {"Apply": calls.service(Details(APPLY))}}
    assert server.generic == (calls,)
    assert calls.service(Details(f"{RM}/GetTicket")) is not None  # served generically


async def test_errors_become_rich_statuses_and_metrics_count_them():
    metrics = Metrics(CollectorRegistry())
    calls = interceptor(metrics=metrics)

    async def apply(request, context):
        if request.user == "full":
            raise ResourceExhausted("does not fit")
        return "ok"

    add(calls, APPLY, grpc.unary_unary_rpc_method_handler(apply))
    handler = composed(calls, APPLY).unary_unary
    await handler(pb.ApplyRequest(), Context())
    context = Context()
    with pytest.raises(grpc.aio.AbortError):
        await handler(pb.ApplyRequest(user="full"), context)
    assert context.status == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert context.reason() == "INSUFFICIENT_RESOURCE"
    assert sample(metrics, "labelrm_rpc_total", method=APPLY, code="OK") == 1
    assert sample(metrics, "labelrm_rpc_total", method=APPLY, code="RESOURCE_EXHAUSTED") == 1
    assert sample(metrics, "labelrm_apply_total", outcome="granted") == 1
    assert sample(metrics, "labelrm_apply_total", outcome="insufficient_resource") == 1
    assert sample(metrics, "labelrm_rpc_duration_seconds_count", method=APPLY, code="OK") == 1


async def test_waiting_applies_are_counted_while_they_wait_and_cancellations_recorded():
    metrics = Metrics(CollectorRegistry())
    calls = interceptor(metrics=metrics)
    started = asyncio.Event()

    async def apply(request, context):
        started.set()
        await asyncio.sleep(60)

    add(calls, APPLY, grpc.unary_unary_rpc_method_handler(apply))
    request = pb.ApplyRequest()
    request.wait_timeout.seconds = 30
    task = asyncio.create_task(composed(calls, APPLY).unary_unary(request, Context()))
    await started.wait()
    assert sample(metrics, "labelrm_apply_waiting") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sample(metrics, "labelrm_apply_waiting") == 0
    assert sample(metrics, "labelrm_rpc_total", method=APPLY, code="CANCELLED") == 1
    assert sample(metrics, "labelrm_apply_total", outcome="cancelled") == 1


async def test_the_auth_step_runs_before_the_servicer_and_releases_after_it():
    calls = interceptor(auth=True)
    ran = []

    async def apply(request, context):
        ran.append(request.user)
        return "ok"

    add(calls, APPLY, grpc.unary_unary_rpc_method_handler(apply))
    handler = composed(calls, APPLY).unary_unary
    anonymous = Context()
    with pytest.raises(grpc.aio.AbortError):
        await handler(pb.ApplyRequest(), anonymous)
    assert anonymous.status == grpc.StatusCode.UNAUTHENTICATED and ran == []
    alice = (("authorization", "Bearer alice-token"),)
    waiting = pb.ApplyRequest()
    waiting.labels.add(key="userCreator", value="alice-IDE")
    waiting.labels.add(key="engineType", value="spark-3")
    waiting.wait_timeout.seconds = 5
    # max_waiting_applies=1: the second waiting Apply passes only if the first released.
    for _ in range(2):
        assert await handler(waiting, Context(alice)) == "ok"
    assert ran == ["alice", "alice"]  # the policy filled in the caller
    # Health checks are public: no credentials needed.
    add(calls, "grpc.health.v1.Health/Check", grpc.unary_unary_rpc_method_handler(apply))
    check = composed(calls, "grpc.health.v1.Health/Check").unary_unary
    assert await check(pb.ApplyRequest(user="probe"), Context()) == "ok"


async def test_guarded_methods_refuse_shapes_without_a_request_message():
    calls = interceptor(auth=True)

    async def upload(requests, context):
        return "ok"

    add(calls, f"{RM}/Upload", grpc.stream_unary_rpc_method_handler(upload))
    context = Context((("authorization", "Bearer alice-token"),))
    with pytest.raises(grpc.aio.AbortError):
        await composed(calls, f"{RM}/Upload").unary_unary(None, context)
    assert context.status == grpc.StatusCode.PERMISSION_DENIED
    assert "no access check" in context.details


async def test_streaming_calls_get_the_same_treatment():
    metrics = Metrics(CollectorRegistry())
    calls = interceptor(metrics=metrics)
    method = "labelrm.v1.EngineConnService/StreamAgentCommands"

    async def stream(request, context):
        yield 1
        yield 2
        raise NotFound("agent gone")

    add(calls, method, grpc.unary_stream_rpc_method_handler(stream))
    context = Context()
    with pytest.raises(grpc.aio.AbortError):
        await composed(calls, method).unary_stream(None, context)
    assert context.written == [1, 2]
    assert context.status == grpc.StatusCode.NOT_FOUND and context.reason() == "NOT_FOUND"
    assert sample(metrics, "labelrm_rpc_total", method=method, code="NOT_FOUND") == 1


async def test_a_stream_ends_inside_its_handler_task():
    """A client gone while a response is being written: the handler task is cancelled
    there, and the servicer's generator is closed and the call logged in that task, not
    later by the garbage collector after grpc has finished the call."""
    calls = interceptor()
    method = "labelrm.v1.EngineConnService/StreamAgentCommands"
    closed = []

    async def stream(request, context):
        try:
            yield 1
            yield 2
        finally:
            closed.append("closed")

    add(calls, method, grpc.unary_stream_rpc_method_handler(stream))
    context = Context(stalled=asyncio.Event())
    handler = composed(calls, method).unary_stream
    task = asyncio.create_task(handler(None, context))
    assert context.stalled is not None
    await asyncio.wait_for(context.stalled.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == ["closed"] and context.written == [1]
