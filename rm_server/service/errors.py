"""Maps the RM's error hierarchy to gRPC status codes, in one place.

Every error becomes a google.rpc.Status with an ErrorInfo (stable reason,
domain "labelrm.io", metadata) and, where it applies, a BadRequest naming the
field, a PreconditionFailure naming the state, or a QuotaFailure plus a
labelrm.v1.Shortfalls listing every label and dimension that fell short.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from labelrm.v1 import resource_pb2

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
]


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
    code = next((c for cls, c in _CODES if isinstance(err, cls)), code_pb2.INTERNAL)
    metadata: dict[str, str] = {}
    details: list[Any] = []
    message = err.message
    if isinstance(err, InvalidArgument):
        metadata["field"] = err.field
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=err.field, description=err.description
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
                        description=f"requested {s.requested}, available {s.available}",
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
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN, metadata=metadata)
    return status_pb2.Status(
        code=code, message=message, details=[_pack(info), *(_pack(d) for d in details)]
    )


def encode_error(err: LabelrmError) -> tuple[int, bytes]:
    """(status code, serialized google.rpc.Status) to store with a request id."""
    status = status_of(err)
    return status.code, status.SerializeToString()


async def abort(context: grpc.aio.ServicerContext, err: BaseException) -> None:
    if isinstance(err, ReplayedError):
        status = status_pb2.Status.FromString(err.status)
    elif isinstance(err, LabelrmError):
        status = status_of(err)
    else:
        log.exception("internal error", exc_info=err)
        status = status_pb2.Status(code=code_pb2.INTERNAL, message="internal error")
    await context.abort_with_status(rpc_status.to_status(status))


Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def _wrap_unary(behavior: Behavior) -> Behavior:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort(context, exc)
            raise AssertionError("unreachable") from exc  # abort raises

    return wrapped


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Turns exceptions escaping unary handlers into rich gRPC statuses."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            _wrap_unary(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
