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
    ResourceTypeError,
    Shortfall,
    convert,
    fits,
    headroom,
)

# The source of a label record that holds an ECM's capacity (its registration).
ECM_SOURCE = "ecm"
# The source of a YARN queue's record (rm_server/external): it holds the yarn part of its
# tickets, what labelrm has granted on the queue.
EXTERNAL_SOURCE = "external"


def charged_part(source: str, maximum: Resource | None, request: Resource) -> Resource:
    """What a label record is charged for `request`: all of it, except on an ECM's record
    and on a YARN queue's (the yarn part of a `driver_and_yarn` request).

    An ECM's record has one type, its registered total's, for its whole life. It runs
    drivers, not YARN containers: of a `driver_and_yarn` request it takes the driver
    part (the yarn part belongs to the YARN queue it names, on the cluster label that
    serves it), a bare `yarn` request has no part on it at all, and anything else must
    widen to the ECM's type (a `load` request on a `load_instance` ECM counts no
    instances). ResourceTypeError for what does not fit."""
    if source == EXTERNAL_SOURCE and request.kind is ResourceKind.DRIVER_AND_YARN:
        return request.yarn_part()
    if source != ECM_SOURCE or maximum is None:
        return request
    kind = maximum.kind
    if request.kind is kind:
        return request
    if request.kind is ResourceKind.DRIVER_AND_YARN:
        request = request.driver_part()
    elif request.kind is ResourceKind.YARN:
        raise ResourceTypeError(
            "a yarn resource is not charged to an ECM: it belongs to its YARN queue"
        )
    try:
        return convert(request, kind)
    except ResourceTypeError as exc:
        raise ResourceTypeError(
            f"the ECM's record holds {kind.value}, which a {request.kind.value} request"
            " does not fit"
        ) from exc


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
