"""The RM's error hierarchy. Each class maps to one gRPC status code in
`rm_server.service.errors.status_for` (applied to every call by
`rm_server.service.interceptor`); nothing else in the server picks codes.

The pure domain raises its own errors (rm_server/domain/errors.py); one that names the
request field it concerns is an INVALID_ARGUMENT, made here (`as_rm_error`) and nowhere
else."""

from __future__ import annotations

from collections.abc import Sequence

from labelrm_common.quantity import Shortfall
from rm_server.domain.errors import DomainError


class LabelrmError(Exception):
    """Base class; `reason` is a stable UPPER_SNAKE identifier sent as ErrorInfo.reason."""

    reason = "INTERNAL"
    # A transient refusal: the same request may succeed later with nothing changed by
    # its caller (capacity returns, the database comes back, an ECM recovers). Never
    # stored under the request id, so a retry is tried afresh (store.db.is_final).
    transient = False

    def __init__(
        self, message: str, *, reason: str | None = None, transient: bool | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        if transient is not None:
            self.transient = transient


class InvalidArgument(LabelrmError):
    """The request itself is wrong; `field` names the offending field path."""

    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str, *, reason: str | None = None) -> None:
        super().__init__(f"{field}: {message}", reason=reason)
        self.field = field
        self.description = message


class NotFound(LabelrmError):
    reason = "NOT_FOUND"


class FailedPrecondition(LabelrmError):
    """The target is in a state that forbids the operation; `state` names it."""

    reason = "FAILED_PRECONDITION"

    def __init__(
        self,
        message: str,
        *,
        state: str = "",
        reason: str | None = None,
        transient: bool | None = None,
    ) -> None:
        super().__init__(message, reason=reason, transient=transient)
        self.state = state


class ResourceExhausted(LabelrmError):
    """A request did not fit; `shortfalls` lists every label and dimension short."""

    reason = "INSUFFICIENT_RESOURCE"
    transient = True

    def __init__(
        self, message: str, shortfalls: Sequence[Shortfall] = (), *, reason: str | None = None
    ) -> None:
        super().__init__(message, reason=reason)
        self.shortfalls = tuple(shortfalls)


def not_found(kind: str, object_id: str) -> NotFound:
    """The answer for an object id that does not exist, and for one the caller may not
    know of (another user's ticket or EngineConn, rm_server.security.policy): the same
    answer, so that a refusal does not tell which ids exist."""
    return NotFound(f"{kind} {object_id} not found")


class EcmNotRegistered(NotFound):
    """An Apply names an `emInstance` that no registered ECM has."""

    reason = "ECM_NOT_REGISTERED"


class EcmNotRunning(FailedPrecondition):
    """An Apply names an ECM that cannot take work now (LOST, DRAINING); transient: a
    LOST ECM that beats again takes work again."""

    reason = "ECM_NOT_RUNNING"
    transient = True


class DeadlineExceeded(LabelrmError):
    reason = "WAIT_TIMEOUT"
    transient = True

    def __init__(self, message: str, shortfalls: Sequence[Shortfall] = ()) -> None:
        super().__init__(message)
        self.shortfalls = tuple(shortfalls)


class Unavailable(LabelrmError):
    reason = "DATABASE_UNAVAILABLE"
    transient = True


class Aborted(LabelrmError):
    reason = "ABORTED"
    transient = True


class Unimplemented(LabelrmError):
    """A method the server lists (a service's generated stub) but does not implement."""

    reason = "UNIMPLEMENTED"


class Unauthenticated(LabelrmError):
    """No credentials, or credentials that prove nothing (rm_server.security)."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(LabelrmError):
    """The caller is known but may not do this (rm_server.security.policy)."""

    reason = "PERMISSION_DENIED"


def as_rm_error(exc: BaseException) -> LabelrmError | None:
    """`exc` as the RM error a call ends with: itself; for a domain error naming the
    field it concerns, the INVALID_ARGUMENT naming that field; None for anything else
    (a domain error naming no field, or any other exception, is a bug)."""
    if isinstance(exc, LabelrmError):
        return exc
    if isinstance(exc, DomainError) and exc.field:
        return InvalidArgument(exc.field, exc.message)
    return None


def describe_shortfalls(shortfalls: Sequence[Shortfall]) -> str:
    """One line naming every label and dimension that fell short."""
    return "; ".join(str(s) for s in shortfalls)
