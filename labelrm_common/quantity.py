"""Quantities as people write and read them, the Kubernetes way.

Memory: plain bytes, binary suffixes Ki Mi Gi Ti Pi (powers of 1024) and decimal ones
k/K M G T P (powers of 1000), fractions allowed ("1.5Gi"). CPU: cores ("2", "0.5") or
millicores ("500m"). Output: exact values in the largest exact unit ("4Gi"; CPU "500m" or
"2" in tables), otherwise one decimal of the largest unit not above the value ("23.5Gi"),
never a kibibyte count for a host's memory. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

__all__ = [
    "Shortfall",
    "format_bytes",
    "format_cpu",
    "format_quantity",
    "parse_cpu",
    "parse_memory",
]

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5}
_DECIMAL = {"k": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_MEMORY_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*([KMGTP]i|[kKMGTP])?B?")
_CPU_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(m?)")


def parse_memory(text: str) -> int:
    """Bytes from "536870912", "512Mi", "2Gi", "1G" (10^9), "1.5Gi"; ValueError otherwise."""
    m = _MEMORY_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"invalid memory quantity {text!r}: expected e.g. 512Mi, 2Gi or 1G")
    number, suffix = Decimal(m.group(1)), m.group(2) or ""
    if suffix in _BINARY:
        value = number * 1024 ** _BINARY[suffix]
    elif suffix:
        value = number * 1000 ** _DECIMAL[suffix]
    else:
        value = number
    if value != value.to_integral_value():
        raise ValueError(f"memory quantity {text!r} is not a whole number of bytes")
    return int(value)


def parse_cpu(text: str) -> int:
    """Millicores from "500m", "2" (cores) or "0.5"; ValueError otherwise."""
    m = _CPU_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"invalid CPU quantity {text!r}: expected e.g. 500m, 2 or 0.5")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
        raise ValueError(f"invalid CPU quantity {text!r}") from None
    millis = number if m.group(2) else number * 1000
    if millis != millis.to_integral_value():
        raise ValueError(f"CPU quantity {text!r} is finer than a millicore")
    return int(millis)


def format_bytes(n: int) -> str:
    """ "4Gi" when exact, "23.5Gi" when not, "512" below one KiB."""
    for suffix, power in (("Pi", 5), ("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1)):
        size = 1024**power
        if n >= size or (n and n % size == 0):
            if n % size == 0:
                return f"{n // size}{suffix}"
            return f"{n / size:.1f}{suffix}"
    return str(n)


def format_cpu(millis: int) -> str:
    """ "2" for whole cores (and "0"), "500m" otherwise."""
    if millis % 1000 == 0:
        return str(millis // 1000)
    return f"{millis}m"


def format_quantity(dimension: str, value: int) -> str:
    """A quantity of `dimension` (memory_bytes, yarn.cpu_millis, instances, ...) for people,
    next to its dimension's name: memory in units ("1Gi"), CPU always in millicores ("3000m",
    as the name cpu_millis says), anything else as the number."""
    if dimension.endswith("memory_bytes"):
        return format_bytes(value)
    if dimension.endswith("cpu_millis"):
        return f"{value}m"
    return str(value)


@dataclass(frozen=True)
class Shortfall:
    """One dimension in which a request exceeds what is left under ``label`` (the RM's
    refusal, and the client's view of it: labelrm.v1.Shortfalls)."""

    label: str
    dimension: str
    requested: int
    available: int

    def __str__(self) -> str:
        """``label dimension: requested X, available Y`` with quantities for people; an
        empty label is the request itself."""
        return (
            f"{self.label or '(request)'} {self.dimension}: "
            f"requested {format_quantity(self.dimension, self.requested)}, "
            f"available {format_quantity(self.dimension, self.available)}"
        )
