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

Refusals are logged, but not one line each: any local user can call the port, and a
line per refusal let one write 68,500 bytes into the user's stderr.log in 1.4 s (500
calls). The first refusal from a peer address is logged at once; the further ones are
counted and logged as one line per peer and interval (`RefusalLog`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import grpc

log = logging.getLogger(__name__)

SECRET_ENV = "LABELRM_EC_SECRET"
SECRET_FILE_ENV = "LABELRM_EC_SECRET_FILE"
AUTH_HEADER = "authorization"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]

REFUSAL_LOG_INTERVAL = 60.0  # seconds: at most one line per peer per interval, then
MAX_LOGGED_PEERS = 1024  # peers counted apart; more are counted together
OTHER_PEERS = "other peers"


class Timer(Protocol):
    def cancel(self) -> None: ...


Schedule = Callable[[float, Callable[[], None]], Timer]


def peer_host(peer: str) -> str:
    """The address part of a gRPC peer ("ipv4:127.0.0.1:51234" -> "ipv4:127.0.0.1"): a
    caller's port changes with each connection, its address not."""
    if peer.startswith("ipv6:"):
        host, sep, _ = peer.rpartition("]:")
        return host + "]" if sep else peer
    if peer.startswith("ipv4:"):
        return peer.rpartition(":")[0]
    return peer or "unknown peer"


def _later(delay: float, callback: Callable[[], None]) -> Timer:
    return asyncio.get_running_loop().call_later(delay, callback)


class RefusalLog:
    """Refused calls as log lines, bounded: the first refusal from a peer address is
    logged at once and opens an interval; the further ones in it are counted, and when
    it ends one line says how many there were and why (a new interval opens if there
    were any, so a flood gets one line per interval). `close` writes what is counted.
    """

    def __init__(
        self,
        interval: float = REFUSAL_LOG_INTERVAL,
        schedule: Schedule = _later,
        max_peers: int = MAX_LOGGED_PEERS,
    ) -> None:
        self.interval = interval
        self._schedule = schedule
        self._max_peers = max_peers
        self._open: dict[str, Counter[str]] = {}  # peer -> problems since its last line
        self._timers: dict[str, Timer] = {}

    def refused(self, peer: str, method: str, problem: str) -> None:
        """Note one refused call of `method` from `peer` (a gRPC peer), and why."""
        host = peer_host(peer)
        if host not in self._open and len(self._open) >= self._max_peers:
            host = OTHER_PEERS
        counts = self._open.get(host)
        if counts is not None:
            counts[problem] += 1
            return
        log.warning(
            "refused %s from %s: %s (more refusals from there: one line per %g s)",
            method, host, problem, self.interval,
        )  # fmt: skip
        self._start(host)

    def _start(self, host: str) -> None:
        self._open[host] = Counter()
        self._timers[host] = self._schedule(self.interval, lambda: self._end(host))

    def _end(self, host: str) -> None:
        self._timers.pop(host, None)
        counts = self._open.pop(host, None)
        if counts:
            self._write(host, counts)
            self._start(host)

    @staticmethod
    def _write(host: str, counts: Counter[str]) -> None:
        why = ", ".join(f"{problem}: {n}" for problem, n in counts.most_common())
        total = sum(counts.values())
        calls = "call" if total == 1 else "calls"
        log.warning("refused %d more %s from %s (%s)", total, calls, host, why)

    def close(self) -> None:
        """Write what is counted and stop the timers (the EngineConn is stopping)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for host, counts in sorted(self._open.items()):
            if counts:
                self._write(host, counts)
        self._open.clear()


class SecretAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses (UNAUTHENTICATED) every call without this EngineConn's secret; the
    refusals are logged through a `RefusalLog`."""

    def __init__(self, secret: str, refusals: RefusalLog | None = None) -> None:
        if not secret:
            raise ValueError("an empty secret would admit anyone")
        self._secret = secret.encode()
        self.refusals = refusals if refusals is not None else RefusalLog()

    def close(self) -> None:
        """Log the refusals still counted (call when the server has stopped)."""
        self.refusals.close()

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
        return _refusal(handler, handler_call_details.method, problem, self.refusals)


def _refusal(
    handler: grpc.RpcMethodHandler, method: str, problem: str, refusals: RefusalLog
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only refuses the call."""

    async def refuse(context: grpc.aio.ServicerContext) -> None:
        refusals.refused(str(context.peer() or ""), method, problem)
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
