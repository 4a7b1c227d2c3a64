"""Structured logs: one event per line, as logfmt text or JSON.

rm-server, ecm-agent and rmctl log through the same formatters. A daemon that serves
calls puts the current call in `call_context` (rm-server's `RpcLog`, see
rm_server/observability/rpclog.py); the `ContextFilter` installed by `setup_logging`
copies its request_id, peer and method onto every record logged while the call runs,
whichever module logs it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

LOG_FORMATS = ("text", "json")


class CallContext(Protocol):
    """What the log lines of a call carry (worked out lazily by the implementation)."""

    @property
    def request_id(self) -> str: ...

    @property
    def peer(self) -> str: ...

    @property
    def method(self) -> str: ...


call_context: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "call_context", default=None
)

# Attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "peer",
    "method",
}


class ContextFilter(logging.Filter):
    """Copies the current call's request id, peer and method onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        call = call_context.get()
        if call is None:
            record.request_id = record.peer = record.method = ""
        else:
            record.request_id = call.request_id
            record.peer = call.peer
            record.method = call.method
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
