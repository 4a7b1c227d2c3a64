"""Typed, immutable resource quantities and the arithmetic the manager performs on them
(their kinds, dimensions and errors: rm_server/domain/resource_kinds.py).

A :class:`Resource` is a kind plus a canonical tuple of ``(dimension, quantity)`` pairs.
Quantities are non-negative integers (CPU is in milli-cores) bounded by ``MAX_QUANTITY`` so they
fit a signed 64-bit database column. Every operation validates instead of silently wrapping,
going negative or mixing incompatible kinds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from labelrm_common.quantity import Shortfall as Shortfall  # re-exported: the domain names it here
from rm_server.domain.resource_kinds import (
    CONVERTS_TO,
    QUEUE_RE,
    SORTED_DIMS,
    YARN_KINDS,
    check_quantity,
    check_special_dimension,
    combine_queues,
)

# The vocabulary, re-exported: callers import every resource name from this module.
from rm_server.domain.resource_kinds import CPU as CPU
from rm_server.domain.resource_kinds import INSTANCES as INSTANCES
from rm_server.domain.resource_kinds import KIND_DIMENSIONS as KIND_DIMENSIONS
from rm_server.domain.resource_kinds import MAX_QUANTITY as MAX_QUANTITY
from rm_server.domain.resource_kinds import MAX_SPECIAL_DIMENSIONS as MAX_SPECIAL_DIMENSIONS
from rm_server.domain.resource_kinds import MAX_SPECIAL_NAME_LENGTH as MAX_SPECIAL_NAME_LENGTH
from rm_server.domain.resource_kinds import MEMORY as MEMORY
from rm_server.domain.resource_kinds import SPECIAL_PREFIX as SPECIAL_PREFIX
from rm_server.domain.resource_kinds import YARN_CPU as YARN_CPU
from rm_server.domain.resource_kinds import YARN_INSTANCES as YARN_INSTANCES
from rm_server.domain.resource_kinds import YARN_MEMORY as YARN_MEMORY
from rm_server.domain.resource_kinds import InexactDivisionError as InexactDivisionError
from rm_server.domain.resource_kinds import InvalidResourceError as InvalidResourceError
from rm_server.domain.resource_kinds import NegativeResourceError as NegativeResourceError
from rm_server.domain.resource_kinds import ResourceError as ResourceError
from rm_server.domain.resource_kinds import ResourceKind as ResourceKind
from rm_server.domain.resource_kinds import ResourceOverflowError as ResourceOverflowError
from rm_server.domain.resource_kinds import ResourceTypeError as ResourceTypeError
from rm_server.domain.resource_kinds import join_kind as join_kind
from rm_server.domain.text import clip, short


@dataclass(frozen=True)
class Resource:
    """An immutable, validated resource quantity.

    ``quantities`` is canonical: sorted by dimension name; every dimension of the kind is present
    (for SPECIAL: only non-zero entries are kept). Out-of-order input is normalised; missing,
    extra or duplicate dimensions are rejected. Prefer the classmethod constructors.

    Comparison operators implement a *partial* order: ``a >= b`` holds only when it holds in every
    dimension, so ``not (a >= b)`` does not imply ``a < b``. ``==`` stays structural.
    """

    kind: ResourceKind
    quantities: tuple[tuple[str, int], ...]
    queue: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ResourceKind):
            raise InvalidResourceError(f"kind must be a ResourceKind, got {self.kind!r}")
        if not isinstance(self.queue, str) or not QUEUE_RE.fullmatch(self.queue):
            raise InvalidResourceError(f"invalid yarn queue name {self.queue!r}", "queue")
        if self.queue and self.kind not in YARN_KINDS:
            raise InvalidResourceError(
                f"a queue is only allowed on yarn resources, not {self.kind.value}", "queue"
            )
        seen: dict[str, int] = {}
        for entry in self.quantities:
            if not isinstance(entry, tuple) or len(entry) != 2 or not isinstance(entry[0], str):
                raise InvalidResourceError(
                    f"quantity entry {clip(entry)} is not a (name, int) pair"
                )
            name, value = entry
            if name in seen:
                raise InvalidResourceError(f"duplicate dimension {clip(name)}", short(name))
            seen[name] = check_quantity(name, value)
        if self.kind is ResourceKind.SPECIAL:
            for name in seen:
                check_special_dimension(name)
            canonical = tuple(sorted((n, v) for n, v in seen.items() if v))
        else:
            expected = KIND_DIMENSIONS[self.kind]
            for name in seen:
                if name not in expected:
                    raise InvalidResourceError(
                        f"dimension {clip(name)} does not belong to kind {self.kind.value}",
                        short(name),
                    )
            for name in expected:
                if name not in seen:
                    raise InvalidResourceError(
                        f"kind {self.kind.value} requires dimension {name!r}", name
                    )
            canonical = tuple(sorted(seen.items()))
        # Frozen dataclass: normalising in place needs object.__setattr__.
        object.__setattr__(self, "quantities", canonical)

    @classmethod
    def _trusted(
        cls, kind: ResourceKind, quantities: tuple[tuple[str, int], ...], queue: str = ""
    ) -> Resource:
        """A resource from parts already in canonical form and within bounds (results of
        arithmetic on valid resources): skips the validation, for speed only."""
        if kind is ResourceKind.SPECIAL:
            quantities = tuple(e for e in quantities if e[1])
        r = object.__new__(cls)
        object.__setattr__(r, "kind", kind)
        object.__setattr__(r, "quantities", quantities)
        object.__setattr__(r, "queue", queue)
        return r

    # ----- constructors -------------------------------------------------------------------

    @classmethod
    def memory(cls, memory_bytes: int) -> Resource:
        """A MEMORY resource."""
        return cls(ResourceKind.MEMORY, ((MEMORY, memory_bytes),))

    @classmethod
    def cpu(cls, cpu_millis: int) -> Resource:
        """A CPU resource in milli-cores."""
        return cls(ResourceKind.CPU, ((CPU, cpu_millis),))

    @classmethod
    def load(cls, memory_bytes: int, cpu_millis: int) -> Resource:
        """A LOAD (memory + cpu) resource."""
        return cls(ResourceKind.LOAD, ((MEMORY, memory_bytes), (CPU, cpu_millis)))

    @classmethod
    def instance(cls, instances: int) -> Resource:
        """An INSTANCE (instance count) resource."""
        return cls(ResourceKind.INSTANCE, ((INSTANCES, instances),))

    @classmethod
    def load_instance(cls, memory_bytes: int, cpu_millis: int, instances: int) -> Resource:
        """A LOAD_INSTANCE (memory + cpu + instances) resource."""
        return cls(
            ResourceKind.LOAD_INSTANCE,
            ((MEMORY, memory_bytes), (CPU, cpu_millis), (INSTANCES, instances)),
        )

    @classmethod
    def yarn(cls, queue: str, memory_bytes: int, cpu_millis: int, instances: int) -> Resource:
        """A YARN resource in ``queue`` ("" = unnamed, compatible with any queue)."""
        return cls(
            ResourceKind.YARN,
            ((YARN_MEMORY, memory_bytes), (YARN_CPU, cpu_millis), (YARN_INSTANCES, instances)),
            queue,
        )

    @classmethod
    def driver_and_yarn(cls, driver: Resource, yarn: Resource) -> Resource:
        """Combine a LOAD_INSTANCE driver part and a YARN part into DRIVER_AND_YARN."""
        if driver.kind is not ResourceKind.LOAD_INSTANCE:
            raise ResourceTypeError(f"driver part must be load_instance, not {driver.kind.value}")
        if yarn.kind is not ResourceKind.YARN:
            raise ResourceTypeError(f"yarn part must be yarn, not {yarn.kind.value}")
        return cls(ResourceKind.DRIVER_AND_YARN, driver.quantities + yarn.quantities, yarn.queue)

    @classmethod
    def special(cls, quantities: Mapping[str, int]) -> Resource:
        """A SPECIAL resource from bare names (``{"gpu": 2}`` -> dimension ``special.gpu``).

        Names already carrying the ``special.`` prefix are accepted as-is.
        """
        if len(quantities) > MAX_SPECIAL_DIMENSIONS:  # counted before any is looked at
            raise InvalidResourceError(
                f"too many special dimensions: {len(quantities)} > {MAX_SPECIAL_DIMENSIONS}"
            )
        entries: list[tuple[str, int]] = []
        for name, value in quantities.items():
            if not isinstance(name, str):
                raise InvalidResourceError(f"special name must be a string, got {clip(name)}")
            dim = name if name.startswith(SPECIAL_PREFIX) else SPECIAL_PREFIX + name
            entries.append((dim, value))
        return cls(ResourceKind.SPECIAL, tuple(entries))

    @classmethod
    def zero(cls, kind: ResourceKind, queue: str = "") -> Resource:
        """The zero resource of ``kind``."""
        if type(kind) is ResourceKind and kind is not ResourceKind.SPECIAL and queue == "":
            return cls._trusted(kind, tuple((d, 0) for d in SORTED_DIMS[kind]))
        return cls(kind, tuple((d, 0) for d in KIND_DIMENSIONS[kind]), queue)

    @classmethod
    def from_quantities(
        cls, kind: ResourceKind, quantities: Mapping[str, int], queue: str = ""
    ) -> Resource:
        """Build from full dimension names (as returned by :meth:`as_dict`)."""
        return cls(kind, tuple(quantities.items()), queue)

    # ----- accessors ----------------------------------------------------------------------

    def get(self, dimension: str) -> int:
        """Quantity of ``dimension`` (0 if this resource does not carry it)."""
        for name, value in self.quantities:
            if name == dimension:
                return value
        return 0

    def as_dict(self) -> dict[str, int]:
        """Quantities as a plain ``{dimension: quantity}`` dict."""
        return dict(self.quantities)

    def dimensions(self) -> tuple[str, ...]:
        """Dimension names in canonical (sorted) order."""
        return tuple(name for name, _ in self.quantities)

    def is_zero(self) -> bool:
        """True if every quantity is zero."""
        return all(v == 0 for _, v in self.quantities)

    def driver_part(self) -> Resource:
        """The LOAD_INSTANCE (driver) part of a DRIVER_AND_YARN resource."""
        self._require(ResourceKind.DRIVER_AND_YARN, "driver_part")
        dims = KIND_DIMENSIONS[ResourceKind.LOAD_INSTANCE]
        return Resource(ResourceKind.LOAD_INSTANCE, tuple((d, self.get(d)) for d in dims))

    def yarn_part(self) -> Resource:
        """The YARN part (with queue) of a DRIVER_AND_YARN resource."""
        self._require(ResourceKind.DRIVER_AND_YARN, "yarn_part")
        dims = KIND_DIMENSIONS[ResourceKind.YARN]
        return Resource(ResourceKind.YARN, tuple((d, self.get(d)) for d in dims), self.queue)

    def _require(self, kind: ResourceKind, what: str) -> None:
        if self.kind is not kind:
            raise ResourceTypeError(
                f"{what}() needs a {kind.value} resource, not {self.kind.value}"
            )

    def __str__(self) -> str:
        inner = ", ".join(f"{n}={v}" for n, v in self.quantities)
        queue = f", queue={self.queue}" if self.queue else ""
        return f"{self.kind.value}({inner}{queue})"

    # ----- arithmetic ---------------------------------------------------------------------

    def __add__(self, other: object) -> Resource:
        if not isinstance(other, Resource):
            return NotImplemented
        if _same_shape(self, other):
            out = tuple(
                (d, x + y) for (d, x), (_, y) in zip(self.quantities, other.quantities, strict=True)
            )
            if any(v > MAX_QUANTITY for _, v in out):
                return self._add_general(other)  # names the dimension that overflows
            return Resource._trusted(self.kind, out, self.queue)
        return self._add_general(other)

    def __sub__(self, other: object) -> Resource:
        if not isinstance(other, Resource):
            return NotImplemented
        if _same_shape(self, other):
            out = tuple(
                (d, x - y) for (d, x), (_, y) in zip(self.quantities, other.quantities, strict=True)
            )
            if any(v < 0 for _, v in out):
                return self._sub_general(other)  # names the dimension that goes negative
            return Resource._trusted(self.kind, out, self.queue)
        return self._sub_general(other)

    def _add_general(self, other: Resource) -> Resource:
        kind, queue, dims, a, b = _aligned(self, other)
        out: list[tuple[str, int]] = []
        for d in dims:
            value = a.get(d) + b.get(d)
            if value > MAX_QUANTITY:
                raise ResourceOverflowError(f"sum overflows in {d!r}", d)
            out.append((d, value))
        return Resource._trusted(kind, tuple(out), queue)

    def _sub_general(self, other: Resource) -> Resource:
        kind, queue, dims, a, b = _aligned(self, other)
        out: list[tuple[str, int]] = []
        for d in dims:
            value = a.get(d) - b.get(d)
            if value < 0:
                raise NegativeResourceError(
                    f"subtraction goes negative in {d!r}: {a.get(d)} - {b.get(d)}", d
                )
            out.append((d, value))
        return Resource._trusted(kind, tuple(out), queue)

    def __mul__(self, factor: object) -> Resource:
        if isinstance(factor, bool):
            raise TypeError("cannot multiply a Resource by a bool")
        if not isinstance(factor, int):
            return NotImplemented
        if factor < 0:
            raise InvalidResourceError(f"multiplier must be >= 0, got {factor}")
        out: list[tuple[str, int]] = []
        for d, v in self.quantities:
            value = v * factor
            if value > MAX_QUANTITY:
                raise ResourceOverflowError(f"product overflows in {d!r}", d)
            out.append((d, value))
        return Resource(self.kind, tuple(out), self.queue)

    def __rmul__(self, factor: object) -> Resource:
        return self.__mul__(factor)

    def __truediv__(self, divisor: object) -> Resource:
        """Exact division: every quantity must be a multiple of ``divisor``."""
        d = _check_divisor(divisor)
        if d is None:
            return NotImplemented
        for name, v in self.quantities:
            if v % d:
                raise InexactDivisionError(f"{v} in {name!r} is not divisible by {d}", name)
        return Resource(self.kind, tuple((n, v // d) for n, v in self.quantities), self.queue)

    def __floordiv__(self, divisor: object) -> Resource:
        """Floor division of every quantity (explicitly discards remainders)."""
        d = _check_divisor(divisor)
        if d is None:
            return NotImplemented
        return Resource(self.kind, tuple((n, v // d) for n, v in self.quantities), self.queue)

    # ----- partial order ------------------------------------------------------------------

    def ge(self, other: Resource) -> bool:
        """True iff ``self >= other`` in every dimension of the joined kind."""
        if _same_shape(self, other):
            return all(
                x >= y for (_, x), (_, y) in zip(self.quantities, other.quantities, strict=True)
            )
        _, _, dims, a, b = _aligned(self, other)
        return all(a.get(d) >= b.get(d) for d in dims)

    def gt(self, other: Resource) -> bool:
        """True iff ``self > other`` strictly in every dimension of the joined kind.

        With no dimensions at all (two empty SPECIAL resources) this is False.
        """
        _, _, dims, a, b = _aligned(self, other)
        return bool(dims) and all(a.get(d) > b.get(d) for d in dims)

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Resource):
            return NotImplemented
        return self.ge(other)

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Resource):
            return NotImplemented
        return self.gt(other)

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Resource):
            return NotImplemented
        return other.ge(self)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Resource):
            return NotImplemented
        return other.gt(self)

    # ----- serialisation ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict, e.g. ``{"kind": "load", "memory_bytes": 1, "cpu_millis": 2}``."""
        if self.kind is ResourceKind.SPECIAL:
            return {"kind": self.kind.value, "quantities": dict(self.quantities)}
        out: dict[str, Any] = {"kind": self.kind.value}
        out.update(self.quantities)
        if self.kind in YARN_KINDS:
            out["queue"] = self.queue
        return out

    @classmethod
    def from_dict(cls, data: object) -> Resource:
        """Inverse of :meth:`to_dict`; raises InvalidResourceError on anything malformed."""
        if not isinstance(data, Mapping):
            raise InvalidResourceError(f"resource must be a mapping, got {type(data).__name__}")
        fast = _from_dict_fast(data)
        if fast is not None:
            return fast
        raw_kind = data.get("kind")
        try:
            kind = ResourceKind(raw_kind)
        except ValueError:
            raise InvalidResourceError(f"unknown resource kind {raw_kind!r}", "kind") from None
        rest = {k: v for k, v in data.items() if k != "kind"}
        queue = ""
        if kind in YARN_KINDS:
            raw_queue = rest.pop("queue", "")
            if not isinstance(raw_queue, str):
                raise InvalidResourceError("queue must be a string", "queue")
            queue = raw_queue
        if kind is ResourceKind.SPECIAL:
            quantities = rest.pop("quantities", None)
            if not isinstance(quantities, Mapping):
                raise InvalidResourceError("special resource needs a 'quantities' mapping")
            if rest:
                raise InvalidResourceError(f"unexpected keys {sorted(map(str, rest))}")
            rest = dict(quantities)
        for key in rest:
            if not isinstance(key, str):
                raise InvalidResourceError(f"dimension name must be a string, got {key!r}")
        return cls(kind, tuple(rest.items()), queue)


_FAST_KINDS = {
    k.value: k for k in ResourceKind if k not in YARN_KINDS and k is not ResourceKind.SPECIAL
}


def _from_dict_fast(data: Mapping[Any, Any]) -> Resource | None:
    """from_dict for the common case: a fixed-dimension kind without queue whose every
    dimension is present with an int in range. None: take the general (checking) path."""
    raw = data.get("kind")
    kind = _FAST_KINDS.get(raw) if type(raw) is str else None
    if kind is None:
        return None
    dims = SORTED_DIMS[kind]
    if len(data) != len(dims) + 1:
        return None
    out = []
    for d in dims:
        v = data.get(d)
        if type(v) is not int or not 0 <= v <= MAX_QUANTITY:
            return None
        out.append((d, v))
    return Resource._trusted(kind, tuple(out))


def _check_divisor(divisor: object) -> int | None:
    """The divisor as an int, or None if it is not an int (caller returns NotImplemented)."""
    if isinstance(divisor, bool):
        raise TypeError("cannot divide a Resource by a bool")
    if not isinstance(divisor, int):
        return None
    if divisor == 0:
        raise ZeroDivisionError("division of a Resource by zero")
    if divisor < 0:
        raise InvalidResourceError(f"divisor must be positive, got {divisor}")
    return divisor


def _same_shape(a: Resource, b: Resource) -> bool:
    """Same fixed-dimension kind and queue: the quantities pair up, in canonical order,
    dimension for dimension (the common case of the arithmetic, taken without joining)."""
    return a.kind is b.kind and a.kind is not ResourceKind.SPECIAL and a.queue == b.queue


def _aligned(
    a: Resource, b: Resource
) -> tuple[ResourceKind, str, tuple[str, ...], Resource, Resource]:
    """Join the kinds and queues of ``a`` and ``b``; return (kind, queue, dims, a', b')."""
    kind = join_kind(a.kind, b.kind)
    queue = combine_queues(a.queue, b.queue)
    ca, cb = convert(a, kind), convert(b, kind)
    if kind is ResourceKind.SPECIAL:
        dims = tuple(sorted(set(ca.dimensions()) | set(cb.dimensions())))
    else:
        dims = ca.dimensions()
    return kind, queue, dims, ca, cb


def convert(r: Resource, kind: ResourceKind) -> Resource:
    """Widen ``r`` to ``kind`` (new dimensions are zero); ResourceTypeError if there is no path."""
    if r.kind is kind:
        return r
    if kind not in CONVERTS_TO[r.kind]:
        raise ResourceTypeError(f"cannot convert {r.kind.value} to {kind.value}")
    queue = r.queue if kind in YARN_KINDS else ""
    return Resource._trusted(kind, tuple((d, r.get(d)) for d in SORTED_DIMS[kind]), queue)


def fits(left: Resource, request: Resource, label: str = "") -> list[Shortfall]:
    """Dimensions where ``request`` exceeds ``left``; empty iff ``left >= request``.

    Shortfalls come in canonical (sorted) dimension order of the joined kind.
    Incompatible kinds raise ResourceTypeError.
    """
    if _same_shape(left, request):
        return [
            Shortfall(label, d, y, x)
            for (d, x), (_, y) in zip(left.quantities, request.quantities, strict=True)
            if y > x
        ]
    _, _, dims, a, b = _aligned(left, request)
    return [Shortfall(label, d, b.get(d), a.get(d)) for d in dims if b.get(d) > a.get(d)]


def headroom(maximum: Resource, used: Resource, locked: Resource, protected: Resource) -> Resource:
    """What is left: ``maximum - used - locked - protected`` per dimension, clamped at 0.

    The clamp is deliberate: an admin may shrink a maximum below what is already in use; the
    headroom is then 0 in that dimension rather than negative (or an error).
    """
    kind = maximum.kind
    queue = maximum.queue
    for r in (used, locked, protected):
        kind = join_kind(kind, r.kind)
        queue = combine_queues(queue, r.queue)
    parts = [convert(r, kind) for r in (maximum, used, locked, protected)]
    if kind is ResourceKind.SPECIAL:
        dims = tuple(sorted({d for p in parts for d in p.dimensions()}))
    else:
        dims = KIND_DIMENSIONS[kind]
    m, u, lk, p = parts
    if kind is not ResourceKind.SPECIAL:  # every value is clamped into range: no checks
        return Resource._trusted(
            kind,
            tuple(
                (d, max(0, m.get(d) - u.get(d) - lk.get(d) - p.get(d))) for d in SORTED_DIMS[kind]
            ),
            queue,
        )
    out = tuple((d, max(0, m.get(d) - u.get(d) - lk.get(d) - p.get(d))) for d in dims)
    return Resource(kind, out, queue)


def total(resources: Iterable[Resource], kind: ResourceKind) -> Resource:
    """Sum of ``resources`` starting from ``zero(kind)``.

    Like ``+``, the result is in the join of ``kind`` and every summed kind (usually ``kind``).
    """
    acc = Resource.zero(kind)
    for r in resources:
        acc = acc + r
    return acc
