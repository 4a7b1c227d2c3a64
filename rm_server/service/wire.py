"""Reading requests off the wire: every method's request passes here before any servicer,
auth step or log line sees it (the server's interceptor installs `reader` on each).

Two kinds of bytes are refused here, once for every service, as INVALID_ARGUMENT:

- bytes that do not parse as the method's request message (grpc.aio would otherwise
  answer UNKNOWN and log a traceback per call);
- a NUL character in any string field, at any depth: PostgreSQL's text type cannot hold
  one, so it could only fail later, deep in a transaction, as an internal error. The
  error names the field path (``labels[2].value``, ``heartbeat.agent_id``).

A refused request reaches the composed handler as a `Rejected` in place of the message;
the handler raises its error, so the call ends like any other bad request: one access
log line, no traceback, nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from rm_server.errors import InvalidArgument, LabelrmError

Deserializer = Callable[[bytes], Any]


class Rejected:
    """A request refused as read (module doc, and the interceptor's size limit); `error`
    is what its call ends with."""

    __slots__ = ("error",)

    def __init__(self, error: LabelrmError) -> None:
        self.error = error


def reader(deserialize: Deserializer | None) -> Deserializer | None:
    """`deserialize` (a message class's FromString) made to refuse what the module doc
    says instead of raising; None stays None (raw bytes)."""
    if deserialize is None:
        return None
    message_type = getattr(deserialize, "__self__", None)
    name = message_type.DESCRIPTOR.full_name if message_type is not None else "request"

    def read(data: bytes) -> Any:
        try:
            message = deserialize(data)
        except (DecodeError, ValueError, TypeError, RecursionError) as exc:
            return Rejected(
                InvalidArgument(
                    "request", f"is not a valid {name} message ({exc.__class__.__name__})"
                )
            )
        # A NUL in a string is a NUL byte in its encoding: most requests have no 0 byte
        # at all, and skip the walk.
        if b"\0" in data and isinstance(message, Message):
            path = nul_field(message)
            if path is not None:
                return Rejected(InvalidArgument(path, "must not contain NUL characters"))
        return message

    return read


def nul_field(message: Message, prefix: str = "") -> str | None:
    """The path of the first string field (at any depth) holding a NUL, else None."""
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        if field.type == FieldDescriptor.TYPE_STRING:
            found = _nul_in_strings(field, value, path)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            found = _nul_in_messages(field, value, path)
        else:
            continue
        if found is not None:
            return found
    return None


def _nul_in_strings(field: FieldDescriptor, value: Any, path: str) -> str | None:
    if not field.is_repeated:
        return path if "\0" in value else None
    for i, item in enumerate(value):
        if "\0" in item:
            return f"{path}[{i}]"
    return None


def _nul_in_messages(field: FieldDescriptor, value: Any, path: str) -> str | None:
    entry = field.message_type
    assert entry is not None  # a message field
    if entry.GetOptions().map_entry:
        key_is_text = entry.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
        value_field = entry.fields_by_name["value"]
        for key, item in value.items():
            if key_is_text and "\0" in key:
                return path
            where = f"{path}[{key}]"
            if value_field.type == FieldDescriptor.TYPE_STRING and "\0" in item:
                return where
            if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                found = nul_field(item, where + ".")
                if found is not None:
                    return found
        return None
    if field.is_repeated:
        for i, item in enumerate(value):
            found = nul_field(item, f"{path}[{i}].")
            if found is not None:
                return found
        return None
    return nul_field(value, path + ".")
