"""Typed exceptions for labelrm RPC failures, decoded from the server's google.rpc.Status.

The server sends every error as a google.rpc.Status carrying an ErrorInfo (stable reason,
domain "labelrm.io", metadata) and, depending on the code, a BadRequest (INVALID_ARGUMENT),
a PreconditionFailure (FAILED_PRECONDITION) or a QuotaFailure plus a labelrm.v1.Shortfalls
(RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED). `from_rpc_error` turns a grpc.RpcError into the
matching `RMError` subclass with those details as attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from labelrm.v1 import resource_pb2

from labelrm_common.quantity import Shortfall

DOMAIN = "labelrm.io"

__all__ = [
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "RMError",
    "ResourceExhausted",
    "Shortfall",
    "Unauthenticated",
    "Unavailable",
    "from_rpc_error",
]


class RMError(Exception):
    """A failed labelrm RPC.

    Attributes:
        code: the grpc.StatusCode.
        message: the status message.
        reason: ErrorInfo.reason (a stable UPPER_SNAKE identifier), "" when absent.
        metadata: ErrorInfo.metadata.
        details: the decoded detail messages of the google.rpc.Status.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
        details: Sequence[Any] = (),
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.details: tuple[Any, ...] = tuple(details)

    def _detail(self, kind: type[Any]) -> Any:
        """The first detail of type `kind`, or None."""
        return next((d for d in self.details if isinstance(d, kind)), None)


class InvalidArgument(RMError):
    """INVALID_ARGUMENT; `field` is the offending field path, e.g. "resource.load.memory_bytes"."""

    @property
    def field(self) -> str:
        """The field path from the BadRequest detail (or ErrorInfo metadata)."""
        bad = self._detail(error_details_pb2.BadRequest)
        if bad is not None and bad.field_violations:
            return str(bad.field_violations[0].field)
        return self.metadata.get("field", "")

    @property
    def description(self) -> str:
        """What is wrong with the field, without the field path."""
        bad = self._detail(error_details_pb2.BadRequest)
        if bad is not None and bad.field_violations:
            return str(bad.field_violations[0].description)
        return self.message


class NotFound(RMError):
    """NOT_FOUND: the ticket, label record, ECM or limit does not exist."""


class FailedPrecondition(RMError):
    """FAILED_PRECONDITION; `state` names the state that forbids the operation."""

    @property
    def state(self) -> str:
        """The state from the PreconditionFailure detail (or ErrorInfo metadata)."""
        pre = self._detail(error_details_pb2.PreconditionFailure)
        if pre is not None and pre.violations:
            return str(pre.violations[0].subject)
        return self.metadata.get("state", "")


class _WithShortfalls(RMError):
    @property
    def shortfalls(self) -> list[Shortfall]:
        """Every label and dimension that fell short (empty when the server sent none)."""
        found = self._detail(resource_pb2.Shortfalls)
        if found is None:
            return []
        return [
            Shortfall(s.label, s.dimension, int(s.requested), int(s.available))
            for s in found.shortfalls
        ]


class ResourceExhausted(_WithShortfalls):
    """RESOURCE_EXHAUSTED: the request did not fit; see `shortfalls`."""


class DeadlineExceeded(_WithShortfalls):
    """DEADLINE_EXCEEDED: a waiting apply timed out (see `shortfalls`), or the call's deadline."""


class Unavailable(RMError):
    """UNAVAILABLE: the server (or its database) could not be reached, after retries."""


class PermissionDenied(RMError):
    """PERMISSION_DENIED."""


class Unauthenticated(RMError):
    """UNAUTHENTICATED."""


_CLASSES: dict[Any, type[RMError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}

_DETAIL_TYPES: tuple[type[Any], ...] = (
    error_details_pb2.ErrorInfo,
    error_details_pb2.BadRequest,
    error_details_pb2.PreconditionFailure,
    error_details_pb2.QuotaFailure,
    resource_pb2.Shortfalls,
)


def _unpack(detail: any_pb2.Any) -> Any:
    for kind in _DETAIL_TYPES:
        if detail.Is(kind.DESCRIPTOR):
            msg = kind()
            detail.Unpack(msg)
            return msg
    return detail


def _code_of(err: grpc.RpcError) -> Any:
    code = getattr(err, "code", None)
    value = code() if callable(code) else None
    return value if isinstance(value, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def _message_of(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    value = details() if callable(details) else None
    return str(value) if value else str(err)


def from_rpc_error(err: grpc.RpcError) -> RMError:
    """The typed RMError for a failed call (sync grpc or grpc.aio).

    Decodes the google.rpc.Status from the trailing metadata when present; a status without
    one (for example a client-side deadline or a connection failure) still maps by its code.
    """
    code = _code_of(err)
    message = _message_of(err)
    details: list[Any] = []
    try:
        status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
    except (ValueError, TypeError):
        status = None
    if status is not None:
        message = status.message or message
        details = [_unpack(d) for d in status.details]
    info = next((d for d in details if isinstance(d, error_details_pb2.ErrorInfo)), None)
    reason = str(info.reason) if info is not None else ""
    metadata = dict(info.metadata) if info is not None else {}
    cls = _CLASSES.get(code, RMError)
    return cls(code, message, reason=reason, metadata=metadata, details=details)
