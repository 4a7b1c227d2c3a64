"""The pure domain's errors: one root, DomainError, for a value or a request the domain
refuses.

The domain knows nothing of requests or status codes. What it does know, when it
checks input, is which field it was given (a label path such as ``labels[2].value``,
an engine param such as ``params.memory_bytes``); the service layer's converter that
parsed a request field names the others (``DomainError.at``). It also knows why a
request about something that exists cannot be done: the thing is unknown (`Unknown`),
its state forbids it (`Conflict`), or its capacity is exhausted (`OverCapacity`).

The RM's errors (rm_server/errors.py) are made from these in one place
(``rm_server.errors.as_rm_error``): a DomainError that names a field is the caller's
mistake, INVALID_ARGUMENT naming that field; Unknown is NOT_FOUND, Conflict
FAILED_PRECONDITION (with its state), OverCapacity RESOURCE_EXHAUSTED. A plain
DomainError that names no field and escapes a call is a bug: INTERNAL, logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from labelrm_common.quantity import Shortfall


class DomainError(ValueError):
    """A refused value: ``message`` says why; ``field`` names the input field it
    concerns ("" while nobody has said which: then it is not the caller's mistake);
    ``reason`` is the stable UPPER_SNAKE identifier of the refusal ("" for the default)."""

    # Whether the refusal is the answer to the request: its effects stand (an expired
    # lock stays expired) and a retry gets the same answer. Others change nothing.
    settles = False

    def __init__(self, message: str, field: str = "", *, reason: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message
        self.field = field
        self.reason = reason

    def at(self, field: str, message: str | None = None) -> Self:
        """This error, naming the request field `field` (and saying `message` instead,
        when given): what the converter that parsed that field attaches."""
        self.field = field
        if message is not None:
            self.message = message
        return self


class Unknown(DomainError):
    """The request names something that does not exist (or that the caller may not know
    of: the same answer)."""

    settles = True


class Conflict(DomainError):
    """The state of what the request names forbids it; ``state`` names that state.
    ``transient``: the state may change with nothing done by the caller (an ECM that
    beats again), so the refusal is not the request's final answer."""

    def __init__(
        self, message: str, *, state: str = "", reason: str = "", transient: bool = False
    ) -> None:
        super().__init__(message, reason=reason)
        self.state = state
        self.transient = transient
        self.settles = not transient


class OverCapacity(DomainError):
    """What is asked for does not fit; ``shortfalls`` lists every label and dimension."""

    def __init__(self, message: str, shortfalls: Sequence[Shortfall]) -> None:
        super().__init__(message)
        self.shortfalls = tuple(shortfalls)


class EcmNotRegistered(Unknown):
    """A request names an ECM (its `emInstance` label) that no registered ECM has."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="ECM_NOT_REGISTERED")


class EcmNotRunning(Conflict):
    """A request names an ECM that cannot take work now (LOST, DRAINING); transient: a
    LOST ECM that beats again takes work again."""

    def __init__(self, message: str, *, state: str) -> None:
        super().__init__(message, state=state, reason="ECM_NOT_RUNNING", transient=True)
