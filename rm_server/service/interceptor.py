"""The server's one interceptor: every RPC handler composed once, per method, with what
each call needs, outermost first:

1. its log context (`observability.logging.RpcLog`): request id, peer and method on
   every line logged while it runs, and one ``rpc`` access event when it ends;
2. its metrics (`observability.metrics.RpcMetrics`): duration and status by method,
   Apply outcomes, waiting Applies;
3. the caller (`security.interceptor`'s `admit_caller`: credentials from the metadata
   and the TLS session, the caller's rate, its role against the policy) BEFORE a byte
   of the request is read: grpc hands every handler the raw bytes, so an anonymous
   caller's 4 MiB, or a user's sent to an agent's method, cost a dictionary look-up;
4. reading the request (`_read`): a user RPC's size (`user_max_message_bytes`), the
   parse, the counts and sizes of its repeated fields (`service.bounds`), its strings
   (`service.wire`), each step bounding the next;
5. the policy's ownership check on the request and the abuse limits of apply-like
   calls (`security.interceptor`'s `admit`); steps 3 and 5 are left out for the public
   methods and with authentication off;
6. the status of a failed call: whatever escapes the servicer (or the steps above)
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
import contextlib
import inspect
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import grpc
from google.rpc import status_pb2

from rm_server.errors import PermissionDenied, ResourceExhausted, Unimplemented
from rm_server.observability.metrics import Metrics, RpcMetrics
from rm_server.observability.rpclog import RpcLog, access_level
from rm_server.security import policy
from rm_server.security.identity import peer_host
from rm_server.security.interceptor import AuthInterceptor, Release
from rm_server.security.limits import Limits
from rm_server.service.bounds import check_bounds
from rm_server.service.errors import abort_with, reason_of, status_for
from rm_server.service.free_text import check_free_text_fields
from rm_server.service.wire import Deserializer, check_strings, reader

Unary = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
Streaming = Callable[[Any, grpc.aio.ServicerContext], AsyncGenerator[Any, None]]

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


# Public streams anyone may hold open (no credentials needed): capped per peer address.
CAPPED_STREAMS = frozenset({"grpc.health.v1.Health/Watch"})


class Interceptor(grpc.GenericRpcHandler):
    """Serves every method of the servicers added to it, each composed once (module doc).

    `auth` None: no authentication step at all (tests); `metrics` None: no metrics;
    `limits`: caps the public streams (health Watch) per peer; `user_max_message_bytes`:
    the largest request of a user RPC (every method but the agents' and EngineConns')."""

    def __init__(
        self,
        *,
        auth: AuthInterceptor | None = None,
        metrics: Metrics | None = None,
        limits: Limits | None = None,
        user_max_message_bytes: int = 0,
    ) -> None:
        self.auth = auth
        self.metrics = metrics
        self.limits = limits  # the per-peer cap on public streams (None: no cap)
        self.user_max_message_bytes = user_max_message_bytes  # 0: the server's limit only
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
        limit = self.user_max_message_bytes
        method = _Method(
            name=name,
            level=access_level(name),
            metrics=self.metrics.for_method(name) if self.metrics is not None else None,
            auth=self.auth if guarded else None,
            bounded=not policy.is_public(name),
            free_text=not policy.is_public(name) and not policy.serves_agents(name),
            peer_streams=self.limits if name in CAPPED_STREAMS else None,
            read=reader(handler.request_deserializer),
            max_bytes=limit if limit > 0 and not policy.serves_agents(name) else 0,
        )
        # grpc hands the handler the bytes received, unread: the caller is judged before
        # a byte is parsed (_admit), then service.wire reads them.
        handler = handler._replace(request_deserializer=None)
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
        refuse = _unary(refusal, replace(method, auth=None, read=None), True)
        return grpc.unary_unary_rpc_method_handler(
            refuse, response_serializer=handler.response_serializer
        )


@dataclass(frozen=True)
class _Method:
    name: str  # "labelrm.v1.ResourceManagerService/Apply" (no leading slash)
    level: int  # of its access events
    metrics: RpcMetrics | None
    auth: AuthInterceptor | None  # None: not guarded
    bounded: bool = False  # its requests' counts and sizes are checked (service.bounds)
    free_text: bool = False  # its strings may hold no control character (service.free_text)
    peer_streams: Limits | None = None  # its open calls are capped per peer
    read: Deserializer | None = None  # bytes -> request (service.wire); None: taken as is
    max_bytes: int = 0  # the largest request it reads (user RPCs); 0: the server's limit


def _read(method: _Method, data: Any) -> Any:
    """The request of a call, from the bytes received, each step cheaper than the next
    and bounding it: the size (user RPCs: refused unparsed), the parse, the counts and
    sizes of its repeated fields (service.bounds, before anything walks them), then its
    strings (service.wire: no NUL; service.free_text: no control character in a user
    RPC's)."""
    read = method.read
    if read is None:  # a handler without a deserializer: the request as it came
        return data
    limit = method.max_bytes
    if limit and len(data) > limit:
        raise ResourceExhausted(
            f"request of {len(data)} bytes is larger than the {limit} bytes allowed"
            f" for user calls (user_max_message_bytes): {len(data) - limit} bytes"
            " too many",
            reason="MESSAGE_TOO_LARGE",
        )
    request = read(data)
    if method.bounded:
        check_bounds(request)
    check_strings(request, data)
    if method.free_text:
        check_free_text_fields(request)
    return request


def _wrap(handler: grpc.RpcMethodHandler, method: _Method) -> grpc.RpcMethodHandler | None:
    """The composed handler for the asynchronous shapes; None for a synchronous one."""
    kwargs = {
        "request_deserializer": handler.request_deserializer,
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
    """One call in progress: its log context, start, and status once known. Used as
    ``async with``, inside the call's own handler task: an error raised in the block
    ends the call with the status it maps to; either way the call is logged and counted
    once it is over."""

    __slots__ = ("code", "context", "log", "method", "reason", "start", "waiting")

    def __init__(self, method: _Method, context: grpc.aio.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.log = RpcLog(method.name, None, context)
        self.log.enter()
        self.waiting = False
        self.code = ""
        self.reason = ""
        self.start = time.perf_counter()

    async def __aenter__(self) -> _Call:
        return self

    def read(self, request: Any) -> None:
        """The call's request, once read: its log and metrics may look at it."""
        self.log.request = request
        if self.method.metrics is not None:
            self.waiting = self.method.metrics.begin(request)

    async def __aexit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        try:
            if exc is not None:
                await self.fail(exc)
        finally:
            self.end()

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
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with _Call(method, context) as state:
            release, request = await _admit(method, state, request, unary_request, context)
            try:
                return await behavior(request, context)
            finally:
                release()

    return call


def _streaming(behavior: Streaming, method: _Method, unary_request: bool) -> Unary:
    """A response-streaming handler as a coroutine that writes each response itself.

    The servicer's generator is driven, each response written (context.write) and the
    generator closed all inside the call's own handler task, so nothing of the call
    runs after its handler returned. Handed to grpc as a generator instead, a client
    that went away while a response was being sent left the generator suspended at its
    `yield`; it was closed later by the garbage collector's finaliser in a task of its
    own, after grpc had finished the call, and that touched the ended call (the peer
    for the log line), killing the process with a segmentation fault inside grpc."""
    auth = method.auth

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> None:
        async with _Call(method, context) as state:
            state.log.resolve_peer()  # a stream lives long: one lookup, while surely live
            arrivals: deque[float] = deque()  # of the streamed requests not yet answered
            if not unary_request and method.metrics is not None:
                request = _arrivals(request, arrivals)
            release, request = await _admit(method, state, request, unary_request, context)
            items = behavior(request, context)
            check = auth.stream_check() if auth is not None else None
            if auth is not None and check is not None:  # a revocable credential
                items = _rechecked(items, check, auth.recheck_interval)
            try:
                # _rechecked closes the servicer's generator when it is closed itself.
                async with contextlib.aclosing(items) as responses:
                    async for item in responses:
                        # Each response answers the oldest request (HeartbeatStream's contract).
                        if arrivals and method.metrics is not None:
                            method.metrics.message(time.perf_counter() - arrivals.popleft())
                        await context.write(item)
            finally:
                release()

    return stream


async def _admit(
    method: _Method,
    state: _Call,
    request: Any,
    unary_request: bool,
    context: grpc.aio.ServicerContext,
) -> tuple[Release, Any]:
    """Admit one call: the caller first, from its credentials alone (auth's
    `admit_caller`: nothing of an anonymous or unentitled caller's request is read),
    then its request (`_read`), the per-peer cap of a public stream, and the auth step
    on the request; when the client streams its requests, each message is read and
    checked as the servicer reads it (the servicer sees only messages that passed).
    Returns what to call when the call ends and the request to serve."""
    auth = method.auth
    if auth is not None:
        await auth.admit_caller(method.name, context)
    if unary_request:
        request = _read(method, request)
        state.read(request)
    else:
        request = _each_read(method, request)
    releases: list[Release] = []
    if method.peer_streams is not None:
        releases.append(method.peer_streams.open_stream(peer_host(str(context.peer() or ""))))
    if auth is not None:
        try:
            releases.append(await auth.admit(method.name, request if unary_request else None))
        except BaseException:
            _release_all(releases)
            raise
        if not unary_request:
            request = _each_admitted(auth, method.name, request)
    return (lambda: _release_all(releases)), request


def _release_all(releases: list[Release]) -> None:
    for release in releases:
        release()


async def _each_read(method: _Method, messages: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for data in messages:
        yield _read(method, data)


async def _rechecked(
    items: AsyncIterator[Any], check: Callable[[], None], interval: float
) -> AsyncGenerator[Any, None]:
    """`items`, with `check` (raises once the caller's credential is revoked) run before
    each one is sent, and every `interval` seconds while none comes: a revoked caller's
    stream ends even while it is idle, and never sends another message (an agent's
    launch commands carry EngineConn secrets and keys)."""
    source = aiter(items)
    try:
        while True:
            following = asyncio.ensure_future(anext(source))
            try:
                while True:
                    done, _ = await asyncio.wait((following,), timeout=interval)
                    check()
                    if done:
                        break
            except BaseException:
                following.cancel()
                with contextlib.suppress(BaseException):
                    await following
                raise
            try:
                item = following.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        closing = getattr(source, "aclose", None)
        if closing is not None:
            with contextlib.suppress(Exception):
                await closing()


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
