"""Who may run code in this EngineConn: callers presenting its secret.

The executor listens on a local port, which every user of the host can reach, and runs
code as the EngineConn's user. So every call must carry ``authorization: Bearer
<secret>``: the secret the RM generates for each EngineConn at CreateEngineConn, sends
the agent with the launch, which writes it to a file only the EngineConn's user can read
(``LABELRM_EC_SECRET_FILE`` names it; never into the launch script or the environment),
and hands back only to its owner
(proxy users and admins too) in the Create / Ask / Get responses. Anything else is
UNAUTHENTICATED before the executor sees the request. Neither the secret nor a token a
caller sent is ever logged.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

log = logging.getLogger(__name__)

SECRET_ENV = "LABELRM_EC_SECRET"
SECRET_FILE_ENV = "LABELRM_EC_SECRET_FILE"
AUTH_HEADER = "authorization"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class SecretAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses (UNAUTHENTICATED) every call without this EngineConn's secret."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("an empty secret would admit anyone")
        self._secret = secret.encode()

    def check(self, metadata: Sequence[tuple[str, Any]] | None) -> str | None:
        """None if the call carries the secret, else why not (never the token itself)."""
        values = [value for key, value in metadata or () if key == AUTH_HEADER]
        if len(values) != 1:
            return "more than one authorization value" if values else "no authorization"
        scheme, _, token = str(values[0]).partition(" ")
        if scheme.lower() != "bearer" or not token:
            return "authorization is not a bearer token"
        # Constant time: how much of a guess matched must not show in the answer's timing.
        # (Imported here: hmac pulls in hashlib, which the start-up does not need.)
        import hmac

        if not hmac.compare_digest(token.encode(), self._secret):
            return "wrong secret"
        return None

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        problem = self.check(handler_call_details.invocation_metadata)
        if handler is None or problem is None:
            return handler  # an authenticated call runs unwrapped
        return _refusal(handler, handler_call_details.method, problem)


def _refusal(handler: grpc.RpcMethodHandler, method: str, problem: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only refuses the call."""

    async def refuse(context: grpc.aio.ServicerContext) -> None:
        log.warning("refused %s from %s: %s", method, context.peer(), problem)
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "this EngineConn requires its secret: send 'authorization: Bearer <secret>' "
            "(the secret field of GetEngineConn)",
        )

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse(context)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse(context)
        yield  # pragma: no cover - makes this an async generator; abort raised above

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
    # Execute streams and Cancel is unary; any other shape is refused as a unary call,
    # which fails the call either way: nothing reaches the executor unauthenticated.
    return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
