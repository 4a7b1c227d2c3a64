"""The server's one interceptor: every RPC handler composed once, per method, with what
each call needs, outermost first:

1. its log context (`observability.logging.RpcLog`): request id, peer and method on
   every line logged while it runs, and one ``rpc`` access event when it ends;
2. its metrics (`observability.metrics.RpcMetrics`): duration and status by method,
   Apply outcomes, waiting Applies;
3. authentication, the access policy and the abuse limits (`security.interceptor`),
   left out for the public methods and with authentication off;
4. the status of a failed call: whatever escapes the servicer (or the auth step)
   ends the call with the status `service.errors.status_for` maps it to, the one
   mapping of errors to status codes.

Composed when the handler is added, not per call: grpc.aio runs every
ServerInterceptor as a coroutine on every call, and the four that were here each
re-wrapped the handler on every call. Servicers are added to `Interceptor` instead
(the generated ``add_*_to_server`` functions take it like a server), and `install`
hands the composed handlers to the server. The methods called at high rates
(`HOT_METHODS`) become registered methods: grpc keeps one accept slot per registered
method, so under load it takes in calls of different methods together (one generic
slot for all cost ~10 % more CPU per Apply cycle). The others share the generic slot:
grpc.aio waits on every slot each time it accepts a call, and with all ~40 methods
registered that wait cost ~5 % of the RM's CPU at 5000 agents beating.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import grpc
from google.rpc import status_pb2

from rm_server.errors import PermissionDenied, Unimplemented
from rm_server.observability.logging import RpcLog, access_level
from rm_server.observability.metrics import Metrics, RpcMetrics
from rm_server.security.interceptor import AuthInterceptor, Release
from rm_server.service.errors import abort_with, reason_of, status_for
from rm_server.service.wire import Rejected, reader

Unary = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
Streaming = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]

STATUS_DETAILS_KEY = "grpc-status-details-bin"
# grpc.aio reports codes as StatusCode members; map raw ints (google.rpc codes) too.
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


# The methods with an accept slot of their own (module doc): the Apply cycle and the
# agents' and EngineConns' beats.
HOT_METHODS = frozenset(
    {
        "/labelrm.v1.ResourceManagerService/Apply",
        "/labelrm.v1.ResourceManagerService/ReportUsed",
        "/labelrm.v1.ResourceManagerService/Release",
        "/labelrm.v1.ResourceManagerService/Heartbeat",
        "/labelrm.v1.EngineConnService/ReportEngineConnState",
    }
)


class Interceptor(grpc.GenericRpcHandler):
    """Serves every method of the servicers added to it, each composed once (module doc).

    `auth` None: no authentication step at all (tests); `metrics` None: no metrics."""

    def __init__(
        self, *, auth: AuthInterceptor | None = None, metrics: Metrics | None = None
    ) -> None:
        self.auth = auth
        self.metrics = metrics
        self._services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}  # by "/service/method"
        self._generic: list[grpc.GenericRpcHandler] = []

    def install(self, server: grpc.aio.Server) -> None:
        """Serve every method added here on `server` (before it starts): the hot ones
        as registered methods, the rest through `service` (module doc)."""
        for service, handlers in self._services.items():
            hot = {n: h for n, h in handlers.items() if f"/{service}/{n}" in HOT_METHODS}
            if hot:
                server.add_registered_method_handlers(service, hot)
        server.add_generic_rpc_handlers((self,))

    # ----- what the generated add_*_to_server functions call on a server ------------------

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        composed = self._services.setdefault(service, {})
        for name, handler in handlers.items():
            path = f"/{service}/{name}"
            composed[name] = self._handlers[path] = self.compose(path, handler)

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        """Kept for the methods the registered ones do not name (generated code adds each
        service both ways)."""
        self._generic.extend(handlers)

    # ----- grpc.GenericRpcHandler: the methods grpc finds no registered handler for -------

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method
        handler = self._handlers.get(path)
        if handler is not None:
            return handler
        for generic in self._generic:  # a method added only generically: composed once
            found = generic.service(handler_call_details)
            if found is not None:
                handler = self._handlers[path] = self.compose(path, found)
                return handler
        return None  # unknown method: UNIMPLEMENTED (never cached: clients pick the names)

    # ----- composition ------------------------------------------------------------------------

    def compose(self, path: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` with every call going through the steps of the module doc."""
        name = path.lstrip("/")
        guarded = self.auth is not None and self.auth.guards(name)
        method = _Method(
            name=name,
            level=access_level(name),
            metrics=self.metrics.for_method(name) if self.metrics is not None else None,
            auth=self.auth if guarded else None,
        )
        # The auth step needs the request message: on guarded methods, the shapes where
        # the client streams its requests (and synchronous handlers) are refused, unless
        # the policy checks each message (HeartbeatStream).
        streams_checked = guarded and self.auth is not None and self.auth.checks_each_message(name)
        if not guarded or handler.unary_unary or handler.unary_stream or streams_checked:
            wrapped = _wrap(handler, method)
            if wrapped is not None:
                return wrapped
            # Synchronous: every servicer here is asynchronous, so this is a generated base
            # class's stub of a method the servicer does not implement (health's List):
            # UNIMPLEMENTED, not the stub's NotImplementedError (UNKNOWN, a traceback).
            refusal = _unimplemented(name)
        else:
            refusal = _refuse(name)
        refuse = _unary(refusal, replace(method, auth=None), True)
        return grpc.unary_unary_rpc_method_handler(
            refuse,
            request_deserializer=reader(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )


@dataclass(frozen=True)
class _Method:
    name: str  # "labelrm.v1.ResourceManagerService/Apply" (no leading slash)
    level: int  # of its access events
    metrics: RpcMetrics | None
    auth: AuthInterceptor | None  # None: not guarded


def _wrap(handler: grpc.RpcMethodHandler, method: _Method) -> grpc.RpcMethodHandler | None:
    """The composed handler for the asynchronous shapes; None for a synchronous one."""
    kwargs = {
        # Every request is read by service.wire, which refuses bad bytes (the call then
        # gets a `Rejected`: raised below as the call's error, before anything else).
        "request_deserializer": reader(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }
    shapes = (
        (handler.unary_unary, grpc.unary_unary_rpc_method_handler, True),
        (handler.unary_stream, grpc.unary_stream_rpc_method_handler, True),
        (handler.stream_unary, grpc.stream_unary_rpc_method_handler, False),
        (handler.stream_stream, grpc.stream_stream_rpc_method_handler, False),
    )
    for behavior, make, unary_request in shapes:
        if behavior is None:
            continue
        # A response stream is an async generator, or a coroutine writing with
        # context.write (health's Watch): that one wraps like a unary call.
        if inspect.isasyncgenfunction(behavior):
            return make(_streaming(behavior, method, unary_request), **kwargs)
        if inspect.iscoroutinefunction(behavior):
            return make(_unary(behavior, method, unary_request), **kwargs)
        return None
    return None


class _Call:
    """One call in progress: its log context, start, and status once known."""

    __slots__ = ("code", "context", "log", "method", "reason", "start", "waiting")

    def __init__(self, method: _Method, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.log = RpcLog(method.name, request, context)
        self.log.enter()
        self.waiting = method.metrics.begin(request) if method.metrics is not None else False
        self.code = ""
        self.reason = ""
        self.start = time.perf_counter()

    async def fail(self, exc: BaseException) -> None:
        """Note how the call failed. An error raised by the servicer or the auth step ends
        the call with the status it maps to (raises grpc's AbortError)."""
        if isinstance(exc, Exception) and not isinstance(exc, grpc.aio.AbortError):
            status = status_for(exc)
            self.code, self.reason = _CODE_NAMES.get(status.code, "UNKNOWN"), reason_of(status)
            await abort_with(self.context, status)
        self.code, self.reason = _finished_status(self.context, exc)

    def end(self) -> None:
        if not self.code:  # returned normally (a servicer may still have set a code)
            self.code, self.reason = _finished_status(self.context, None)
        seconds = time.perf_counter() - self.start
        method = self.method
        if method.metrics is not None:
            method.metrics.end(self.waiting, self.code, self.reason, seconds)
        self.log.finish(method.level, self.code, self.reason, seconds)


def _unary(behavior: Unary, method: _Method, unary_request: bool) -> Unary:
    auth = method.auth

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        state = _Call(method, request if unary_request else None, context)
        try:
            request = _accepted(request, unary_request)
            release, request = await _admit(auth, method.name, request, unary_request, context)
            try:
                return await behavior(request, context)
            finally:
                if release is not None:
                    release()
        except BaseException as exc:
            await state.fail(exc)
            raise
        finally:
            state.end()

    return call


def _streaming(behavior: Streaming, method: _Method, unary_request: bool) -> Streaming:
    auth = method.auth

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        state = _Call(method, request if unary_request else None, context)
        arrivals: deque[float] = deque()  # of the streamed requests not yet answered
        try:
            request = _accepted(request, unary_request)
            if not unary_request and method.metrics is not None:
                request = _arrivals(request, arrivals)
            release, request = await _admit(auth, method.name, request, unary_request, context)
            try:
                async for item in behavior(request, context):
                    # Each response answers the oldest request (HeartbeatStream's contract).
                    if arrivals and method.metrics is not None:
                        method.metrics.message(time.perf_counter() - arrivals.popleft())
                    yield item
            finally:
                if release is not None:
                    release()
        except BaseException as exc:
            await state.fail(exc)
            raise
        finally:
            state.end()

    return stream


def _accepted(request: Any, unary_request: bool) -> Any:
    """The request as read by service.wire: a refused one raises its error; when the
    client streams its requests, each message is checked as the servicer reads it."""
    if not unary_request:
        return _each_accepted(request)
    if type(request) is Rejected:
        raise request.error
    return request


async def _each_accepted(messages: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for message in messages:
        if type(message) is Rejected:
            raise message.error
        yield message


async def _admit(
    auth: AuthInterceptor | None,
    name: str,
    request: Any,
    unary_request: bool,
    context: grpc.aio.ServicerContext,
) -> tuple[Release | None, Any]:
    """Admit one call: on its request, or, when the client streams its requests, on the
    caller's role now and on each message as the servicer reads it (the servicer sees
    only messages that passed). Returns the limits' release and the request to serve."""
    if auth is None:
        return None, request
    release = await auth.admit(name, request if unary_request else None, context)
    if not unary_request:
        request = _each_admitted(auth, name, request)
    return release, request


async def _arrivals(messages: AsyncIterator[Any], arrivals: deque[float]) -> AsyncIterator[Any]:
    async for message in messages:
        arrivals.append(time.perf_counter())
        yield message


async def _each_admitted(
    auth: AuthInterceptor, name: str, messages: AsyncIterator[Any]
) -> AsyncIterator[Any]:
    async for message in messages:
        await auth.admit_message(name, message)
        yield message


def _unimplemented(name: str) -> Unary:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Unimplemented(f"{name} is not implemented by this server")

    return call


def _refuse(name: str) -> Unary:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        # No RPC of ours has such a shape; one added later must not slip past the policy.
        raise PermissionDenied(f"{name}: no access check for this call shape")

    return call


def _finished_status(
    context: grpc.aio.ServicerContext, exc: BaseException | None
) -> tuple[str, str]:
    """(code name, ErrorInfo reason) of a call whose status the context holds (set by an
    abort), or that was cancelled."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED", ""
    raw = context.code()
    if raw is None:
        return ("OK" if exc is None else "UNKNOWN"), ""
    code = raw.name if isinstance(raw, grpc.StatusCode) else _CODE_NAMES.get(int(raw), "UNKNOWN")
    if code == "OK":
        return code, ""
    for key, value in context.trailing_metadata() or ():
        if key == STATUS_DETAILS_KEY:
            try:
                return code, reason_of(status_pb2.Status.FromString(value))
            except Exception:  # a malformed detail must not break the call's bookkeeping
                break
    return code, ""
