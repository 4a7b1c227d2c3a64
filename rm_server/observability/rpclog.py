"""The per-RPC log context: request id, peer and method on every line a call logs.

The server's interceptor (rm_server/service/interceptor.py) makes an `RpcLog` for every
call and puts it in the shared log context (`RpcLog.enter`); the filter installed by
`labelrm_common.logging.setup_logging` copies its fields onto every record logged while
the call runs. Each finished RPC also logs one ``rpc`` event with its status code and
duration (`RpcLog.finish`, logger ``labelrm.access``; health checks and reflection at DEBUG).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import uuid
from typing import Any

import grpc

from labelrm_common.logging import CallContext, call_context
from rm_server.security.identity import current as current_principal

access_log = logging.getLogger("labelrm.access")

_QUIET_PREFIXES = ("grpc.health.v1.", "grpc.reflection.")


class RpcLog:
    """What the logs of one RPC carry. The request id (generated when the request has
    none) and the peer are worked out the first time a line is logged, if ever."""

    __slots__ = ("_peer", "_request_id", "_token", "context", "method", "request")

    def __init__(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.method = method  # "labelrm.v1.ResourceManagerService/Apply" (no leading slash)
        self.request = request  # None when the client streams requests
        self.context = context
        self._request_id: str | None = None
        self._peer: str | None = None
        self._token: contextvars.Token[CallContext | None] | None = None

    def enter(self) -> None:
        """Make this the RPC whose fields the current context's log lines carry."""
        self._token = call_context.set(self)

    @property
    def request_id(self) -> str:
        """The call's own request_id when it carries one, else a fresh id for correlation."""
        if self._request_id is None:
            given = getattr(self.request, "request_id", "")
            ok = isinstance(given, str) and given
            self._request_id = given if ok else "srv-" + uuid.uuid4().hex[:16]
        return self._request_id

    @property
    def peer(self) -> str:
        if self._peer is None:
            self.resolve_peer()
        return self._peer or ""

    def resolve_peer(self) -> None:
        """Look the peer up now. Only while the call runs: grpc's context must not be
        asked once the call has ended (its core call may be gone)."""
        if self._peer is None:
            self._peer = str(self.context.peer() or "")

    def finish(self, level: int, code: str, reason: str, seconds: float) -> None:
        """Log the call's ``rpc`` event (with the caller the auth step found, if any),
        then leave the context `enter` set."""
        if access_log.isEnabledFor(level):
            self._log(level, code, reason, seconds)
        if self._token is not None:
            # A streaming call's generator may be closed from another context: then the
            # value dies with the call's own context anyway.
            with contextlib.suppress(ValueError):
                call_context.reset(self._token)
            self._token = None

    def _log(self, level: int, code: str, reason: str, seconds: float) -> None:
        extra: dict[str, Any] = {
            "event": "rpc",
            "code": code,
            "duration_ms": round(seconds * 1000, 3),
        }
        if reason:
            extra["reason"] = reason
        caller = current_principal()  # set by the auth step (none: auth off, or public)
        if caller is not None and caller.name:
            extra["caller"] = f"{caller.kind.value}:{caller.name}"
        access_log.log(level, "rpc", extra=extra)


def access_level(method: str) -> int:
    """The level of a method's ``rpc`` events: health checks and reflection at DEBUG."""
    return logging.DEBUG if method.startswith(_QUIET_PREFIXES) else logging.INFO
