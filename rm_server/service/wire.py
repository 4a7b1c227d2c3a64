"""Reading requests off the wire: every method's request passes here before any servicer
or ownership check sees it (the server's interceptor reads each request with `reader`,
once it has judged the caller: bytes of a caller who may not make the call are never
parsed).

Two kinds of bytes are refused here, once for every service, as INVALID_ARGUMENT:

- bytes that do not parse as the method's request message (grpc.aio would otherwise
  answer UNKNOWN and log a traceback per call);
- a NUL character in any string field, at any depth (`check_strings`, run after the
  request's counts are bounded: it walks every field): PostgreSQL's text type cannot
  hold one, so it could only fail later, deep in a transaction, as an internal error.
  The error names the field path (``labels[2].value``, ``heartbeat.agent_id``).

The error is raised in the call's handler, so the call ends like any other bad request:
one access log line, no traceback, nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from rm_server.errors import InvalidArgument

Deserializer = Callable[[bytes], Any]


def reader(deserialize: Deserializer | None) -> Deserializer | None:
    """`deserialize` (a message class's FromString) made to raise InvalidArgument on
    bytes that are not its message; None stays None (the request is taken as it comes)."""
    if deserialize is None:
        return None
    message_type = getattr(deserialize, "__self__", None)
    name = message_type.DESCRIPTOR.full_name if message_type is not None else "request"

    def read(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, ValueError, TypeError, RecursionError) as exc:
            raise InvalidArgument(
                "request", f"is not a valid {name} message ({exc.__class__.__name__})"
            ) from None

    return read


def check_strings(message: Any, data: bytes) -> None:
    """InvalidArgument naming the first string field of `message` (read from `data`)
    that holds a NUL. A NUL in a string is a NUL byte in its encoding: most requests
    have no 0 byte at all, and skip the walk."""
    if b"\0" in data and isinstance(message, Message):
        path = nul_field(message)
        if path is not None:
            raise InvalidArgument(path, "must not contain NUL characters")


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
