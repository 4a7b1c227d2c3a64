"""Per message type, what a check walks: built once from the type's descriptor, then
taken from a cache keyed by the Python class (one dict lookup a request). The bounds
(service/bounds.py) and the free-text check (service/free_text.py) each keep theirs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf.descriptor import Descriptor


class Plan(Protocol):
    @property
    def empty(self) -> bool:
        """Nothing to check in messages of this type."""
        ...


P = TypeVar("P", bound=Plan)


class PlanCache(Generic[P]):
    """The plans of one check, by message class (None: nothing to check, the hot path)."""

    def __init__(self, build: Callable[[Descriptor], P]) -> None:
        self._build = build
        self._of_type: dict[type, P | None] = {}

    def of(self, request: Any) -> P | None:
        """The plan for `request`'s type, None when there is nothing to check."""
        kind = type(request)
        try:
            return self._of_type[kind]
        except KeyError:
            descriptor = getattr(request, "DESCRIPTOR", None)
            found = self._build(descriptor) if descriptor is not None else None
            plan = found if found is not None and not found.empty else None
            self._of_type[kind] = plan
            return plan
