"""Wrapping of gRPC method handlers so that an observer sees every call.

An observer is a context-manager factory: it is entered when a call starts, with the
method, the request (None for client-streaming calls) and the servicer context, and
left when the call ends (normally or not). `call_status` then tells what status the
client got, including the ErrorInfo reason of a rich error.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"

# grpc.aio reports codes as StatusCode members; map raw ints too, to be safe.
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


@dataclass(frozen=True)
class CallInfo:
    """What an observer knows about one RPC when it starts."""

    method: str  # "labelrm.v1.ResourceManagerService/Apply" (no leading slash)
    request: Any  # the request message; None when the client streams requests
    context: grpc.aio.ServicerContext


Observer = Callable[[CallInfo], AbstractContextManager[None]]
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


@dataclass(frozen=True)
class CallStatus:
    code: str  # grpc.StatusCode name: "OK", "RESOURCE_EXHAUSTED", ...
    reason: str  # ErrorInfo.reason of a rich error, "" otherwise


def method_name(handler_call_details: grpc.HandlerCallDetails) -> str:
    return str(handler_call_details.method).lstrip("/")


def call_status(context: grpc.aio.ServicerContext, exc: BaseException | None) -> CallStatus:
    """The status a finished call ends with, from the context and the escaping exception."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return CallStatus("CANCELLED", "")
    raw = context.code()
    if raw is None:
        code = "OK" if exc is None else "UNKNOWN"
    elif isinstance(raw, grpc.StatusCode):
        code = raw.name
    else:
        code = _CODE_NAMES.get(int(raw), "UNKNOWN")
    return CallStatus(code, _reason(context) if code != "OK" else "")


def _reason(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.trailing_metadata() or ():
        if key != STATUS_DETAILS_KEY:
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except Exception:  # a malformed detail must not break the call's bookkeeping
            return ""
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return str(info.reason)
    return ""


def observe_handler(
    handler: grpc.RpcMethodHandler | None, method: str, observer: Observer
) -> grpc.RpcMethodHandler | None:
    """`handler` with every call run inside `observer`; unknown or sync handlers unchanged."""
    if handler is None:
        return None
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None and inspect.iscoroutinefunction(handler.unary_unary):
        return grpc.unary_unary_rpc_method_handler(
            _unary(handler.unary_unary, method, observer, True), **kwargs
        )
    if handler.unary_stream is not None:
        wrapped = _streaming(handler.unary_stream, method, observer, True)
        if wrapped is not None:
            return grpc.unary_stream_rpc_method_handler(wrapped, **kwargs)
    if handler.stream_unary is not None and inspect.iscoroutinefunction(handler.stream_unary):
        return grpc.stream_unary_rpc_method_handler(
            _unary(handler.stream_unary, method, observer, False), **kwargs
        )
    if handler.stream_stream is not None:
        wrapped = _streaming(handler.stream_stream, method, observer, False)
        if wrapped is not None:
            return grpc.stream_stream_rpc_method_handler(wrapped, **kwargs)
    return handler


def _unary(behavior: Any, method: str, observer: Observer, unary_request: bool) -> Any:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with observer(CallInfo(method, request if unary_request else None, context)):
            return await behavior(request, context)

    return call


def _streaming(behavior: Any, method: str, observer: Observer, unary_request: bool) -> Any:
    """A wrapper for a response-streaming behavior: an async generator, or a coroutine
    that writes with context.write. Sync behaviors (run in a thread) are left alone."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with observer(CallInfo(method, request if unary_request else None, context)):
                async for item in behavior(request, context):
                    yield item

        return stream
    if inspect.iscoroutinefunction(behavior):
        return _unary(behavior, method, observer, unary_request)
    return None
