"""Helpers shared by the servicers: idempotency keys, encoders, replays, pages."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from rm_server.domain.idempotency import Idempotency, Replay
from rm_server.errors import InvalidArgument, LabelrmError
from rm_server.security import identity
from rm_server.service.errors import ReplayedError, encode_error

T = TypeVar("T")
M = TypeVar("M", bound=Message)

MAX_REQUEST_ID = 128
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
_TOKEN_PREFIX = "after:"  # page tokens are opaque to clients; this marks ours


def caller_key() -> str:
    """Whose request ids these are: the authenticated principal of the call being served
    ("user:alice"); "" with authentication off (every caller is the same dev admin)."""
    principal = identity.current()
    if principal is None or not principal.name:
        return ""
    return f"{principal.kind.value}:{principal.name}"


def idempotency(method: str, request: Message) -> Idempotency:
    """The idempotency key of a mutating request, scoped to its caller; an empty
    request_id gets a fresh one (the call is then only protected against the server's
    own retries)."""
    request_id: str = getattr(request, "request_id", "")
    if len(request_id) > MAX_REQUEST_ID:
        raise InvalidArgument("request_id", f"must be at most {MAX_REQUEST_ID} characters")
    if not request_id:
        request_id = f"server-{uuid.uuid4().hex}"
    payload = request.SerializeToString(deterministic=True)
    return Idempotency.of(method, request_id, payload, caller_key())


@dataclass
class ProtoEncoder(Generic[T]):
    """Encodes outcomes for the request log: the response message, or a google.rpc.Status.

    A `fresh()` copy, made for one call, keeps the message built for the request log
    (`built`) so that `respond` does not convert the same result a second time. Shared
    module-level encoders keep nothing: concurrent calls use them.
    """

    to_response: Callable[[T], Message]
    keep: bool = False
    built: Message | None = None

    def fresh(self) -> ProtoEncoder[T]:
        return ProtoEncoder(self.to_response, keep=True)

    def ok(self, result: T) -> bytes:
        message = self.to_response(result)
        if self.keep:
            self.built = message
        return message.SerializeToString(deterministic=True)

    def error(self, err: LabelrmError) -> tuple[int, bytes]:
        return encode_error(err)


def respond(outcome: T | Replay, encoder: ProtoEncoder[T], response_type: type[M]) -> M:
    """The response for a fresh outcome, or the stored one of an earlier call."""
    if isinstance(outcome, Replay):
        if outcome.status_code != 0:
            raise ReplayedError(outcome.response)
        return response_type.FromString(outcome.response)
    message = encoder.built if encoder.built is not None else encoder.to_response(outcome)
    assert isinstance(message, response_type)
    return message


@dataclass(frozen=True)
class Page:
    after: str
    size: int


def page_of(request: Any) -> Page:
    size = int(request.page_size)
    if size < 0:
        raise InvalidArgument("page_size", "must not be negative")
    size = DEFAULT_PAGE_SIZE if size == 0 else min(size, MAX_PAGE_SIZE)
    token: str = request.page_token
    after = ""
    if token:
        try:
            decoded = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgument("page_token", "is not a token this server issued") from exc
        if not decoded.startswith(_TOKEN_PREFIX) or "\0" in decoded:
            raise InvalidArgument("page_token", "is not a token this server issued")
        after = decoded.removeprefix(_TOKEN_PREFIX)
    return Page(after, size)


def next_token(items: list[T], page: Page, key: Callable[[T], str]) -> str:
    """Fetch size+1 rows; a token exists only when there is a next page."""
    if len(items) <= page.size:
        return ""
    return base64.urlsafe_b64encode((_TOKEN_PREFIX + key(items[page.size - 1])).encode()).decode()
