"""The base class of the pure domain's errors: a value the domain refuses.

The domain knows nothing of requests or status codes. What it does know, when it
checks input, is which field it was given (a label path such as ``labels[2].value``,
an engine param such as ``params.memory_bytes``); the service layer's converter that
parsed a request field names the others (``DomainError.at``). A domain error that
names a field is the caller's mistake: the one mapping to gRPC statuses
(rm_server/service/errors.py, ``status_for``) answers it with INVALID_ARGUMENT naming
that field, exactly as an ``rm_server.errors.InvalidArgument``. One that names none and
escapes a call is a bug: INTERNAL, logged.
"""

from __future__ import annotations

from typing import Self


class DomainError(ValueError):
    """A refused value: ``message`` says why; ``field`` names the input field it
    concerns ("" while nobody has said which: then it is not the caller's mistake)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message
        self.field = field

    def at(self, field: str, message: str | None = None) -> Self:
        """This error, naming the request field `field` (and saying `message` instead,
        when given): what the converter that parsed that field attaches."""
        self.field = field
        if message is not None:
            self.message = message
        return self
