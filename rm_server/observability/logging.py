"""Structured logs: one event per line, as logfmt text or JSON, and per-RPC context.

`RequestContextInterceptor` puts the request_id, the caller (gRPC peer) and the method
of the RPC being served into context variables; the `ContextFilter` installed by
`setup_logging` copies them onto every record logged while the call runs, whichever
module logs it. Each finished RPC also logs one ``rpc`` event with its status code and
duration (logger ``labelrm.access``; health checks and reflection at DEBUG).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

import grpc

from rm_server.config import LOG_FORMATS
from rm_server.observability._intercept import (
    CallInfo,
    Continuation,
    call_status,
    method_name,
    observe_handler,
)
from rm_server.security.identity import current as current_principal

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
peer_var: contextvars.ContextVar[str] = contextvars.ContextVar("peer", default="")
method_var: contextvars.ContextVar[str] = contextvars.ContextVar("method", default="")

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


class ContextFilter(logging.Filter):
    """Copies the current RPC's context variables onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.peer = peer_var.get()
        record.method = method_var.get()
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
    """Replace the root logger's handlers with one structured handler on `stream`."""
    handler = make_handler(fmt, stream)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def _request_id(call: CallInfo) -> str:
    """The call's own request_id when it carries one, else a fresh id for log correlation."""
    given = getattr(call.request, "request_id", "")
    if isinstance(given, str) and given:
        return given
    return "srv-" + uuid.uuid4().hex[:16]


@contextlib.contextmanager
def rpc_context(call: CallInfo) -> Iterator[None]:
    """Sets the context variables for the call, and logs its ``rpc`` event at the end."""
    tokens = (
        request_id_var.set(_request_id(call)),
        peer_var.set(str(call.context.peer() or "")),
        method_var.set(call.method),
    )
    start = time.perf_counter()
    exc: BaseException | None = None
    try:
        yield
    except BaseException as err:
        exc = err
        raise
    finally:
        status = call_status(call.context, exc)
        level = logging.DEBUG if call.method.startswith(_QUIET_PREFIXES) else logging.INFO
        extra: dict[str, Any] = {
            "event": "rpc",
            "code": status.code,
            "duration_ms": round((time.perf_counter() - start) * 1000, 3),
        }
        if status.reason:
            extra["reason"] = status.reason
        caller = current_principal()  # set by the auth interceptor (none: auth off)
        if caller is not None and caller.name:
            extra["caller"] = f"{caller.kind.value}:{caller.name}"
        access_log.log(level, "rpc", extra=extra)
        # A streaming call's generator may be closed from another context: then the
        # variables die with that context anyway.
        with contextlib.suppress(ValueError):
            for var, token in zip((request_id_var, peer_var, method_var), tokens, strict=True):
                var.reset(token)


class RequestContextInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Outermost interceptor: every log line of an RPC carries its request_id and peer."""

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return observe_handler(handler, method_name(handler_call_details), rpc_context)
