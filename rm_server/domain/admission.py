"""Admission against one label's maximum.

A maximum limits only the dimensions its type names: a `load` limit (memory, CPU)
says nothing about instances, so a `load_instance` request is checked on memory
and CPU only. Special resources are the exception: their canonical form drops
zero quantities, so an absent name there means a maximum of zero.
"""

from __future__ import annotations

from rm_server.domain.resources import (
    KIND_DIMENSIONS,
    Resource,
    ResourceKind,
    Shortfall,
    fits,
    headroom,
)


def _named(maximum: Resource) -> frozenset[str] | None:
    """The dimensions `maximum` limits; None means every dimension."""
    if maximum.kind is ResourceKind.SPECIAL:
        return None
    return frozenset(KIND_DIMENSIONS[maximum.kind])


def label_shortfalls(
    label: str,
    maximum: Resource,
    used: Resource,
    locked: Resource,
    protected: Resource,
    request: Resource,
) -> list[Shortfall]:
    """Every dimension of `request` that the label's headroom cannot cover."""
    left = headroom(maximum, used, locked, protected)
    named = _named(maximum)
    return [s for s in fits(left, request, label) if named is None or s.dimension in named]


def excess_dimensions(maximum: Resource, in_use: Resource) -> list[str]:
    """The named dimensions in which `in_use` exceeds `maximum` (empty when within)."""
    named = _named(maximum)
    return [s.dimension for s in fits(maximum, in_use) if named is None or s.dimension in named]
