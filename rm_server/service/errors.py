"""Maps the RM's error hierarchy to gRPC status codes, in one place (`status_for`; the
server's interceptor, rm_server/service/interceptor.py, ends every failed call with it).
A domain error that names the field it concerns (rm_server/domain/errors.py: a label,
resource, condition text or engine param the request got wrong) ends the call here too,
as the INVALID_ARGUMENT naming that field (rm_server.errors.as_rm_error).

Every error becomes a google.rpc.Status with an ErrorInfo (stable reason,
domain "labelrm.io", metadata) and, where it applies, a BadRequest naming the
field, a PreconditionFailure naming the state, or a QuotaFailure plus a
labelrm.v1.Shortfalls listing every label and dimension that fell short.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from labelrm.v1 import resource_pb2

from labelrm_common.quantity import format_quantity
from rm_server.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    LabelrmError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    as_rm_error,
    describe_shortfalls,
)

log = logging.getLogger(__name__)

DOMAIN = "labelrm.io"

_CODES: list[tuple[type[LabelrmError], int]] = [
    (InvalidArgument, code_pb2.INVALID_ARGUMENT),
    (NotFound, code_pb2.NOT_FOUND),
    (FailedPrecondition, code_pb2.FAILED_PRECONDITION),
    (ResourceExhausted, code_pb2.RESOURCE_EXHAUSTED),
    (DeadlineExceeded, code_pb2.DEADLINE_EXCEEDED),
    (Unavailable, code_pb2.UNAVAILABLE),
    (Aborted, code_pb2.ABORTED),
    (Unauthenticated, code_pb2.UNAUTHENTICATED),
    (PermissionDenied, code_pb2.PERMISSION_DENIED),
    (Unimplemented, code_pb2.UNIMPLEMENTED),
]


# The HTTP status of each code, for the web console's JSON answers (the google.rpc code
# mapping, except FAILED_PRECONDITION: 409, the state conflicts with the action).
_HTTP_STATUS: dict[int, int] = {
    code_pb2.INVALID_ARGUMENT: 400,
    code_pb2.UNAUTHENTICATED: 401,
    code_pb2.PERMISSION_DENIED: 403,
    code_pb2.NOT_FOUND: 404,
    code_pb2.FAILED_PRECONDITION: 409,
    code_pb2.ABORTED: 409,
    code_pb2.RESOURCE_EXHAUSTED: 429,
    code_pb2.UNIMPLEMENTED: 501,
    code_pb2.UNAVAILABLE: 503,
    code_pb2.DEADLINE_EXCEEDED: 504,
}


def code_of(err: LabelrmError) -> int:
    """The google.rpc code of an error of the hierarchy (INTERNAL for its bare root)."""
    return next((c for cls, c in _CODES if isinstance(err, cls)), code_pb2.INTERNAL)


def http_status_of(err: LabelrmError) -> int:
    """The HTTP status the web console answers `err` with: that of its gRPC code."""
    return _HTTP_STATUS.get(code_of(err), 500)


class ReplayedError(LabelrmError):
    """The stored error outcome of an earlier call with the same request id."""

    def __init__(self, status: bytes) -> None:
        super().__init__("replayed")
        self.status = status


def _pack(msg: Any) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg)
    return out


def status_of(err: LabelrmError) -> status_pb2.Status:
    """The google.rpc.Status for a domain error."""
    code = code_of(err)
    metadata: dict[str, str] = {}
    details: list[Any] = []
    message = err.message
    if isinstance(err, InvalidArgument):
        metadata["field"] = err.field
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=_capped(err.field), description=_capped(err.description)
                    )
                ]
            )
        )
    elif isinstance(err, FailedPrecondition):
        metadata["state"] = err.state
        details.append(
            error_details_pb2.PreconditionFailure(
                violations=[
                    error_details_pb2.PreconditionFailure.Violation(
                        type="STATE", subject=err.state, description=err.message
                    )
                ]
            )
        )
    elif isinstance(err, ResourceExhausted | DeadlineExceeded) and err.shortfalls:
        message = f"{err.message}: {describe_shortfalls(err.shortfalls)}"
        metadata["labels"] = ",".join(sorted({s.label for s in err.shortfalls}))
        details.append(
            error_details_pb2.QuotaFailure(
                violations=[
                    error_details_pb2.QuotaFailure.Violation(
                        subject=f"{s.label}/{s.dimension}",
                        description=(
                            f"requested {format_quantity(s.dimension, s.requested)}, "
                            f"available {format_quantity(s.dimension, s.available)}"
                        ),
                    )
                    for s in err.shortfalls
                ]
            )
        )
        details.append(
            resource_pb2.Shortfalls(
                shortfalls=[
                    resource_pb2.Shortfall(
                        label=s.label,
                        dimension=s.dimension,
                        requested=s.requested,
                        available=s.available,
                    )
                    for s in err.shortfalls
                ]
            )
        )
    metadata = {k: _capped(v) for k, v in metadata.items()}
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN, metadata=metadata)
    return status_pb2.Status(
        code=code, message=_capped(message), details=[_pack(info), *(_pack(d) for d in details)]
    )


# The longest message (and ErrorInfo value) a status carries: errors quote what callers
# sent cut short (domain.text.clip); this bounds whatever slips through, so a refusal
# never becomes a trailer too big for the client to read.
MAX_STATUS_TEXT = 1024


def _capped(text: str) -> str:
    if len(text) <= MAX_STATUS_TEXT:
        return text
    return text[:MAX_STATUS_TEXT] + f"... ({len(text)} characters)"


def encode_error(err: LabelrmError) -> tuple[int, bytes]:
    """(status code, serialized google.rpc.Status) to store with a request id."""
    status = status_of(err)
    return status.code, status.SerializeToString()


def status_for(exc: BaseException) -> status_pb2.Status:
    """The google.rpc.Status a call ends with when `exc` escapes its handler: the stored
    one of a replay, the mapped one of an RM error or of a domain error naming its field,
    INTERNAL (logged) otherwise."""
    if isinstance(exc, ReplayedError):
        return status_pb2.Status.FromString(exc.status)
    err = as_rm_error(exc)
    if err is not None:
        return status_of(err)
    log.exception("internal error", exc_info=exc)
    return status_pb2.Status(code=code_pb2.INTERNAL, message="internal error")


def reason_of(status: status_pb2.Status) -> str:
    """The ErrorInfo reason a status carries ("" when none)."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


async def abort_with(context: grpc.aio.ServicerContext, status: status_pb2.Status) -> NoReturn:
    """End the call with `status` (raises grpc's AbortError)."""
    await context.abort_with_status(rpc_status.to_status(status))
    raise AssertionError("unreachable")  # abort_with_status raises
