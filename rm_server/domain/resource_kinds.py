"""The vocabulary of resources: their kinds, the dimensions each kind carries, which kinds
combine into which, the bound of a quantity, and the errors a resource raises.

rm_server/domain/resources.py builds the `Resource` value and its arithmetic on these;
it re-exports every public name here, so callers import from there.
"""

from __future__ import annotations

import enum
import re

from rm_server.domain.errors import DomainError
from rm_server.domain.text import clip, short


# str mixin (not StrEnum) as specified; kinds compare equal to their wire strings.
class ResourceKind(str, enum.Enum):  # noqa: UP042
    """The shape of a resource; it determines which dimensions a resource carries."""

    MEMORY = "memory"
    CPU = "cpu"
    LOAD = "load"
    INSTANCE = "instance"
    LOAD_INSTANCE = "load_instance"
    YARN = "yarn"
    DRIVER_AND_YARN = "driver_and_yarn"
    SPECIAL = "special"


# Largest quantity of one dimension: the maximum of a signed BIGINT column.
MAX_QUANTITY = 2**63 - 1

MEMORY = "memory_bytes"
CPU = "cpu_millis"
INSTANCES = "instances"
YARN_MEMORY = "yarn.memory_bytes"
YARN_CPU = "yarn.cpu_millis"
YARN_INSTANCES = "yarn.instances"
SPECIAL_PREFIX = "special."
# Special dimensions one request may name (each becomes a stored dimension of every
# label record it touches), and the longest name (SPECIAL_NAME_RE).
MAX_SPECIAL_DIMENSIONS = 16
MAX_SPECIAL_NAME_LENGTH = 64

# Dimension names are globally unique across kinds, so converting a narrower kind to a wider one
# is just "add the missing dimensions at zero". SPECIAL has no fixed dimensions.
KIND_DIMENSIONS: dict[ResourceKind, tuple[str, ...]] = {
    ResourceKind.MEMORY: (MEMORY,),
    ResourceKind.CPU: (CPU,),
    ResourceKind.LOAD: (MEMORY, CPU),
    ResourceKind.INSTANCE: (INSTANCES,),
    ResourceKind.LOAD_INSTANCE: (MEMORY, CPU, INSTANCES),
    ResourceKind.YARN: (YARN_MEMORY, YARN_CPU, YARN_INSTANCES),
    ResourceKind.DRIVER_AND_YARN: (MEMORY, CPU, INSTANCES, YARN_MEMORY, YARN_CPU, YARN_INSTANCES),
    ResourceKind.SPECIAL: (),
}

YARN_KINDS = frozenset({ResourceKind.YARN, ResourceKind.DRIVER_AND_YARN})
# The dimensions of each kind in canonical (sorted) order, as `quantities` holds them.
SORTED_DIMS: dict[ResourceKind, tuple[str, ...]] = {
    k: tuple(sorted(d)) for k, d in KIND_DIMENSIONS.items()
}

# Direct conversion edges, narrower -> wider.
_WIDER: dict[ResourceKind, tuple[ResourceKind, ...]] = {
    ResourceKind.MEMORY: (ResourceKind.LOAD,),
    ResourceKind.CPU: (ResourceKind.LOAD,),
    ResourceKind.LOAD: (ResourceKind.LOAD_INSTANCE,),
    ResourceKind.INSTANCE: (ResourceKind.LOAD_INSTANCE,),
    ResourceKind.LOAD_INSTANCE: (ResourceKind.DRIVER_AND_YARN,),
    ResourceKind.YARN: (ResourceKind.DRIVER_AND_YARN,),
    ResourceKind.DRIVER_AND_YARN: (),
    ResourceKind.SPECIAL: (),
}


def _reachable(kind: ResourceKind) -> frozenset[ResourceKind]:
    seen: set[ResourceKind] = {kind}
    todo = [kind]
    while todo:
        for nxt in _WIDER[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return frozenset(seen)


# Transitive closure (each kind reaches itself), computed once.
CONVERTS_TO: dict[ResourceKind, frozenset[ResourceKind]] = {k: _reachable(k) for k in ResourceKind}

SPECIAL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
QUEUE_RE = re.compile(r"[A-Za-z0-9_.:@/+-]{0,255}")


class ResourceError(DomainError):
    """Base class of resource errors; ``dimension`` names the offending dimension or is "".
    A resource does not know which request field it came from: the converter that built
    it from one names it (rm_server/service/convert.py)."""

    def __init__(self, message: str, dimension: str = "") -> None:
        super().__init__(message)
        self.dimension = dimension


class InvalidResourceError(ResourceError):
    """A quantity, name, queue or dimension set is not valid for the resource."""


class ResourceTypeError(ResourceError):
    """Two resources cannot be combined: no conversion between kinds, or yarn queues differ."""


class NegativeResourceError(ResourceError):
    """A subtraction would make ``dimension`` negative."""


class ResourceOverflowError(ResourceError):
    """A result in ``dimension`` would exceed ``MAX_QUANTITY``."""


class InexactDivisionError(ResourceError):
    """``/`` was asked to divide a quantity that is not a multiple of the divisor."""


def check_quantity(dimension: str, value: object) -> int:
    # bool is an int subclass; True as "1 byte" is always a caller bug, so reject it.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidResourceError(
            f"quantity of {clip(dimension)} must be an integer, got {type(value).__name__}",
            short(dimension),
        )
    if value < 0:
        raise InvalidResourceError(
            f"quantity of {clip(dimension)} must be >= 0, got {value}", short(dimension)
        )
    if value > MAX_QUANTITY:
        raise InvalidResourceError(
            f"quantity of {clip(dimension)} exceeds the maximum {MAX_QUANTITY}", short(dimension)
        )
    return int(value)


def check_special_dimension(dimension: str) -> None:
    name = dimension[len(SPECIAL_PREFIX) :] if dimension.startswith(SPECIAL_PREFIX) else ""
    if len(name) > MAX_SPECIAL_NAME_LENGTH or not SPECIAL_NAME_RE.fullmatch(name):
        raise InvalidResourceError(
            f"invalid special dimension {clip(dimension)}: expected 'special.<name>' with"
            " <name> matching [A-Za-z][A-Za-z0-9_.-]{0,63}",
            short(dimension),
        )


def combine_queues(a: str, b: str) -> str:
    # An unnamed queue is compatible with any queue; the result keeps the named one.
    if not a:
        return b
    if not b or a == b:
        return a
    raise ResourceTypeError(f"cannot combine yarn queue {a!r} with yarn queue {b!r}")


def join_kind(a: ResourceKind, b: ResourceKind) -> ResourceKind:
    """The kind two resources are combined in.

    The wider kind if one converts to the other; otherwise the narrowest of LOAD / LOAD_INSTANCE
    both convert to (memory + cpu -> load). Anything else raises ResourceTypeError: yarn never
    silently absorbs driver-side kinds, and SPECIAL combines only with SPECIAL.
    """
    if a is b:
        return a
    if b in CONVERTS_TO[a]:
        return b
    if a in CONVERTS_TO[b]:
        return a
    for candidate in (ResourceKind.LOAD, ResourceKind.LOAD_INSTANCE):
        if candidate in CONVERTS_TO[a] and candidate in CONVERTS_TO[b]:
            return candidate
    raise ResourceTypeError(f"cannot combine {a.value} with {b.value}")
