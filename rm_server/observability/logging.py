"""Structured logs: one event per line, as logfmt text or JSON, and per-RPC context.

The server's interceptor (rm_server/service/interceptor.py) makes an `RpcLog` for every
call and puts it in a context variable (`RpcLog.enter`); the `ContextFilter` installed
by `setup_logging` copies its request_id, caller (gRPC peer) and method onto every
record logged while the call runs, whichever module logs it. Each finished RPC also
logs one ``rpc`` event with its status code and duration (`RpcLog.finish`, logger
``labelrm.access``; health checks and reflection at DEBUG).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import uuid
from datetime import UTC, datetime
from typing import Any, TextIO

import grpc

from rm_server.config import LOG_FORMATS
from rm_server.security.identity import current as current_principal

_current: contextvars.ContextVar[RpcLog | None] = contextvars.ContextVar("rpc", default=None)

access_log = logging.getLogger("labelrm.access")

_QUIET_PREFIXES = ("grpc.health.v1.", "grpc.reflection.")
# Attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "peer",
    "method",
}


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
        self._token: contextvars.Token[RpcLog | None] | None = None

    def enter(self) -> None:
        """Make this the RPC whose fields the current context's log lines carry."""
        self._token = _current.set(self)

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
                _current.reset(self._token)
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


class ContextFilter(logging.Filter):
    """Copies the current RPC's request id, peer and method onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        rpc = _current.get()
        if rpc is None:
            record.request_id = record.peer = record.method = ""
        else:
            record.request_id = rpc.request_id
            record.peer = rpc.peer
            record.method = rpc.method
        return True


def _fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    """The event as ordered key/values: ts, level, logger, msg, RPC context, extras, exc."""
    ts = datetime.fromtimestamp(record.created, UTC)
    out: dict[str, Any] = {
        "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname,
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key in ("request_id", "peer", "method"):
        value = getattr(record, key, "")
        if value:
            out[key] = value
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    if record.exc_info:
        out["exc"] = formatter.formatException(record.exc_info)
    if record.stack_info:
        out["stack"] = record.stack_info
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, self), default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """logfmt: ``key=value`` pairs, values quoted when needed; newlines escaped so a
    traceback stays on its event's line."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt(v)}" for k, v in _fields(record, self).items())


def _logfmt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in text for c in ' "=\n\r\t\\'):
        return text
    return json.dumps(text, ensure_ascii=False)


def make_handler(fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """A handler writing structured events (`fmt` "text" or "json") to `stream`."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    return handler


def setup_logging(level: str = "INFO", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one structured handler on `stream`
    (gRPC's Python modules log through the root logger too; its C core is kept to
    errors by the package, see rm_server/__init__.py)."""
    handler = make_handler(fmt, stream)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
