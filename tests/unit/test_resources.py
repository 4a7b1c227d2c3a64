"""Tests for rm_server.domain.resources: arithmetic, partial order, conversion, serialisation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.resources import (
    CPU,
    INSTANCES,
    KIND_DIMENSIONS,
    MAX_QUANTITY,
    MEMORY,
    YARN_MEMORY,
    InexactDivisionError,
    InvalidResourceError,
    NegativeResourceError,
    Resource,
    ResourceKind,
    ResourceOverflowError,
    ResourceTypeError,
    Shortfall,
    convert,
    fits,
    headroom,
    join_kind,
    total,
)

# Small enough that sums of a handful of resources never overflow.
SMALL = st.integers(min_value=0, max_value=2**40)
QUEUES = st.sampled_from(["", "root.default", "root.etl"])
SPECIAL_NAMES = st.sampled_from(["gpu", "fpga", "license.matlab", "ssd"])
FIXED_KINDS = [k for k in ResourceKind if k is not ResourceKind.SPECIAL]


@st.composite
def resources_of(draw: st.DrawFn, kind: ResourceKind, queue: str | None = None) -> Resource:
    """A valid Resource of ``kind``; yarn kinds get a random (or the given) queue."""
    if kind is ResourceKind.SPECIAL:
        return Resource.special(draw(st.dictionaries(SPECIAL_NAMES, SMALL, max_size=4)))
    q = ""
    if kind in (ResourceKind.YARN, ResourceKind.DRIVER_AND_YARN):
        q = draw(QUEUES) if queue is None else queue
    return Resource.from_quantities(kind, {d: draw(SMALL) for d in KIND_DIMENSIONS[kind]}, q)


kinds = st.sampled_from(list(ResourceKind))
any_resource = kinds.flatmap(resources_of)


@st.composite
def same_kind_pair(draw: st.DrawFn) -> tuple[Resource, Resource]:
    kind = draw(kinds)
    queue = draw(QUEUES)
    return draw(resources_of(kind, queue)), draw(resources_of(kind, queue))


@st.composite
def same_kind_triple(draw: st.DrawFn) -> tuple[Resource, Resource, Resource]:
    kind = draw(kinds)
    queue = draw(QUEUES)
    return (
        draw(resources_of(kind, queue)),
        draw(resources_of(kind, queue)),
        draw(resources_of(kind, queue)),
    )


@st.composite
def compatible_pair(draw: st.DrawFn) -> tuple[Resource, Resource]:
    """Two resources whose kinds join (possibly different kinds)."""
    a_kind = draw(kinds)
    partners = [k for k in ResourceKind if _joins(a_kind, k)]
    b_kind = draw(st.sampled_from(partners))
    queue = draw(QUEUES)
    return draw(resources_of(a_kind, queue)), draw(resources_of(b_kind, queue))


def _joins(a: ResourceKind, b: ResourceKind) -> bool:
    try:
        join_kind(a, b)
    except ResourceTypeError:
        return False
    return True


# ----- properties ----------------------------------------------------------------------------


@given(same_kind_pair())
def test_add_then_sub_is_identity(pair: tuple[Resource, Resource]) -> None:
    a, b = pair
    assert (a + b) - b == a


@given(compatible_pair())
def test_add_is_commutative(pair: tuple[Resource, Resource]) -> None:
    a, b = pair
    assert a + b == b + a


@given(same_kind_triple())
def test_add_is_associative(t: tuple[Resource, Resource, Resource]) -> None:
    a, b, c = t
    assert (a + b) + c == a + (b + c)


@given(any_resource)
def test_ge_is_reflexive(a: Resource) -> None:
    assert a >= a
    assert a <= a


@given(same_kind_pair())
def test_ge_is_antisymmetric(pair: tuple[Resource, Resource]) -> None:
    a, b = pair
    if a >= b and b >= a:
        assert a == b


@given(same_kind_triple())
def test_ge_is_transitive(t: tuple[Resource, Resource, Resource]) -> None:
    a, b, c = t
    # Build a chain so the premise is actually exercised, not vacuously true.
    big, mid = a + b + c, a + b
    assert big >= mid and mid >= a
    assert big >= a
    if a >= b and b >= c:
        assert a >= c


@given(compatible_pair())
def test_sum_dominates_each_summand(pair: tuple[Resource, Resource]) -> None:
    a, b = pair
    assert a + b >= a
    assert a + b >= b


@given(compatible_pair())
def test_fits_empty_iff_ge(pair: tuple[Resource, Resource]) -> None:
    left, req = pair
    shortfalls = fits(left, req, label="L")
    assert (shortfalls == []) == left.ge(req)
    for s in shortfalls:
        assert s.requested > s.available
        assert s.label == "L"
        assert s.requested == req.get(s.dimension)
        assert s.available == left.get(s.dimension)


@given(any_resource)
def test_dict_round_trip(r: Resource) -> None:
    d = r.to_dict()
    # Must survive real JSON, not just a Python dict copy.
    assert Resource.from_dict(json.loads(json.dumps(d))) == r


K = ResourceKind
# Independent statement of the conversion graph (transitive, reflexive).
CONVERTIBLE: dict[ResourceKind, set[ResourceKind]] = {
    K.MEMORY: {K.MEMORY, K.LOAD, K.LOAD_INSTANCE, K.DRIVER_AND_YARN},
    K.CPU: {K.CPU, K.LOAD, K.LOAD_INSTANCE, K.DRIVER_AND_YARN},
    K.LOAD: {K.LOAD, K.LOAD_INSTANCE, K.DRIVER_AND_YARN},
    K.INSTANCE: {K.INSTANCE, K.LOAD_INSTANCE, K.DRIVER_AND_YARN},
    K.LOAD_INSTANCE: {K.LOAD_INSTANCE, K.DRIVER_AND_YARN},
    K.YARN: {K.YARN, K.DRIVER_AND_YARN},
    K.DRIVER_AND_YARN: {K.DRIVER_AND_YARN},
    K.SPECIAL: {K.SPECIAL},
}


@given(any_resource, kinds)
def test_conversion_preserves_quantities(r: Resource, kind: ResourceKind) -> None:
    if kind not in CONVERTIBLE[r.kind]:
        with pytest.raises(ResourceTypeError):
            convert(r, kind)
        return
    c = convert(r, kind)
    assert c.kind is kind
    for d in r.dimensions():
        assert c.get(d) == r.get(d)
    assert sum(c.as_dict().values()) == sum(r.as_dict().values())
    assert c.queue == (r.queue if kind in (K.YARN, K.DRIVER_AND_YARN) else "")


@given(kinds.flatmap(lambda k: st.tuples(*(resources_of(k, "") for _ in range(4)))))
def test_headroom_never_negative(rs: tuple[Resource, Resource, Resource, Resource]) -> None:
    m, u, lk, p = rs
    left = headroom(m, u, lk, p)
    assert all(v >= 0 for v in left.as_dict().values())
    for d in left.dimensions():
        assert left.get(d) == max(0, m.get(d) - u.get(d) - lk.get(d) - p.get(d))


@given(same_kind_pair(), st.integers(min_value=1, max_value=1000))
def test_mul_then_div_is_identity(pair: tuple[Resource, Resource], n: int) -> None:
    a, _ = pair
    assert (a * n) / n == a
    assert (n * a) // n == a


# ----- examples ------------------------------------------------------------------------------


def test_memory_plus_cpu_is_load() -> None:
    r = Resource.memory(100) + Resource.cpu(250)
    assert r == Resource.load(100, 250)
    assert r.kind is ResourceKind.LOAD


def test_join_kind_table() -> None:
    assert join_kind(K.MEMORY, K.INSTANCE) is K.LOAD_INSTANCE
    assert join_kind(K.CPU, K.INSTANCE) is K.LOAD_INSTANCE
    assert join_kind(K.LOAD, K.INSTANCE) is K.LOAD_INSTANCE
    assert join_kind(K.MEMORY, K.DRIVER_AND_YARN) is K.DRIVER_AND_YARN
    assert join_kind(K.YARN, K.DRIVER_AND_YARN) is K.DRIVER_AND_YARN
    for a, b in [(K.YARN, K.LOAD_INSTANCE), (K.SPECIAL, K.MEMORY), (K.YARN, K.CPU)]:
        with pytest.raises(ResourceTypeError):
            join_kind(a, b)


def test_yarn_plus_memory_is_type_error() -> None:
    with pytest.raises(ResourceTypeError, match="cannot combine yarn with memory"):
        _ = Resource.yarn("q", 1, 1, 1) + Resource.memory(1)


def test_different_yarn_queues_rejected_but_unnamed_is_compatible() -> None:
    with pytest.raises(ResourceTypeError, match="queue"):
        _ = Resource.yarn("a", 1, 1, 1) + Resource.yarn("b", 1, 1, 1)
    r = Resource.yarn("", 1, 1, 1) + Resource.yarn("b", 1, 1, 1)
    assert r.queue == "b" and r.get(YARN_MEMORY) == 2


def test_subtraction_to_negative_names_dimension() -> None:
    with pytest.raises(NegativeResourceError) as exc:
        _ = Resource.load(10, 5) - Resource.load(5, 6)
    assert exc.value.dimension == CPU
    with pytest.raises(NegativeResourceError) as exc2:
        _ = Resource.special({"gpu": 1}) - Resource.special({"fpga": 1})
    assert exc2.value.dimension == "special.fpga"


def test_overflow() -> None:
    with pytest.raises(ResourceOverflowError) as exc:
        _ = Resource.memory(MAX_QUANTITY) + Resource.memory(1)
    assert exc.value.dimension == MEMORY
    with pytest.raises(ResourceOverflowError):
        _ = Resource.instance(2**62) * 2
    assert Resource.memory(MAX_QUANTITY - 1) + Resource.memory(1) == Resource.memory(MAX_QUANTITY)


def test_division() -> None:
    assert Resource.load(10, 4) / 2 == Resource.load(5, 2)
    with pytest.raises(InexactDivisionError) as exc:
        _ = Resource.load(10, 3) / 2
    assert exc.value.dimension == CPU
    assert Resource.load(10, 3) // 2 == Resource.load(5, 1)
    with pytest.raises(ZeroDivisionError):
        _ = Resource.memory(1) / 0
    with pytest.raises(ZeroDivisionError):
        _ = Resource.memory(1) // 0


def test_bad_multipliers() -> None:
    with pytest.raises(TypeError):
        _ = Resource.memory(1) * True
    with pytest.raises(TypeError):
        _ = Resource.memory(1) * 1.5
    with pytest.raises(InvalidResourceError):
        _ = Resource.memory(1) * -1


@pytest.mark.parametrize("bad", [-1, True, 1.5, 2**63, "1", None])
def test_invalid_quantities_rejected(bad: object) -> None:
    with pytest.raises(InvalidResourceError) as exc:
        Resource.memory(bad)  # type: ignore[arg-type]
    assert exc.value.dimension == MEMORY


def test_invalid_shapes_rejected() -> None:
    with pytest.raises(InvalidResourceError):  # missing cpu
        Resource(ResourceKind.LOAD, ((MEMORY, 1),))
    with pytest.raises(InvalidResourceError):  # foreign dimension
        Resource(ResourceKind.MEMORY, ((MEMORY, 1), (INSTANCES, 1)))
    with pytest.raises(InvalidResourceError):  # duplicate
        Resource(ResourceKind.MEMORY, ((MEMORY, 1), (MEMORY, 2)))
    with pytest.raises(InvalidResourceError):  # queue on a non-yarn kind
        Resource(ResourceKind.MEMORY, ((MEMORY, 1),), "q")
    with pytest.raises(InvalidResourceError):
        Resource.special({"bad name": 1})
    with pytest.raises(InvalidResourceError):
        Resource(ResourceKind.SPECIAL, (("gpu", 1),))  # missing "special." prefix


def test_construction_normalises_order_and_special_zeros() -> None:
    r = Resource(ResourceKind.LOAD, ((MEMORY, 1), (CPU, 2)))
    assert r == Resource(ResourceKind.LOAD, ((CPU, 2), (MEMORY, 1)))
    assert r.dimensions() == (CPU, MEMORY)
    s = Resource.special({"gpu": 0, "fpga": 2})
    assert s.as_dict() == {"special.fpga": 2}
    assert Resource.special({"gpu": 0}) == Resource.zero(ResourceKind.SPECIAL)


def test_partial_order_incomparable() -> None:
    a, b = Resource.load(10, 1), Resource.load(1, 10)
    assert not a >= b and not b >= a
    assert not a < b and not b < a
    assert fits(a, b, "x") == [Shortfall("x", CPU, 10, 1)]


def test_gt_requires_every_dimension() -> None:
    assert Resource.load(2, 2) > Resource.load(1, 1)
    assert not Resource.load(2, 1) > Resource.load(1, 1)
    assert Resource.load(2, 1) >= Resource.load(1, 1)
    empty = Resource.zero(ResourceKind.SPECIAL)
    assert not empty > empty and empty >= empty


def test_cross_kind_comparison() -> None:
    assert Resource.load_instance(5, 5, 1) >= Resource.memory(5)
    assert not Resource.memory(5) >= Resource.cpu(1)


def test_driver_and_yarn_parts() -> None:
    driver = Resource.load_instance(1, 2, 3)
    yarn = Resource.yarn("root.q", 4, 5, 6)
    r = Resource.driver_and_yarn(driver, yarn)
    assert r.driver_part() == driver
    assert r.yarn_part() == yarn
    assert r.queue == "root.q"
    assert r.get(MEMORY) == 1 and r.get(YARN_MEMORY) == 4
    with pytest.raises(ResourceTypeError):
        Resource.driver_and_yarn(yarn, driver)
    with pytest.raises(ResourceTypeError):
        driver.yarn_part()


def test_to_dict_shapes() -> None:
    assert Resource.load(1, 2).to_dict() == {"kind": "load", "memory_bytes": 1, "cpu_millis": 2}
    assert Resource.yarn("q", 1, 2, 3).to_dict()["queue"] == "q"
    assert Resource.special({"gpu": 2}).to_dict() == {
        "kind": "special",
        "quantities": {"special.gpu": 2},
    }


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        [],
        {"kind": "nope"},
        {"kind": "memory"},
        {"kind": "memory", "memory_bytes": -1},
        {"kind": "memory", "memory_bytes": "5"},
        {"kind": "memory", "memory_bytes": 1, "cpu_millis": 1},
        {"kind": "memory", "memory_bytes": 1, "queue": "q"},
        {
            "kind": "yarn",
            "yarn.memory_bytes": 1,
            "yarn.cpu_millis": 1,
            "yarn.instances": 1,
            "queue": 5,
        },
        {"kind": "special"},
        {"kind": "special", "quantities": {"special.gpu": 1}, "extra": 1},
    ],
)
def test_from_dict_rejects_garbage(garbage: object) -> None:
    with pytest.raises(InvalidResourceError):
        Resource.from_dict(garbage)


def test_headroom_clamps_and_widens() -> None:
    left = headroom(
        Resource.load(100, 10),
        Resource.memory(150),
        Resource.cpu(2),
        Resource.zero(ResourceKind.LOAD),
    )
    assert left == Resource.load(0, 8)


def test_total() -> None:
    assert total([], ResourceKind.LOAD) == Resource.zero(ResourceKind.LOAD)
    assert total([Resource.memory(1), Resource.cpu(2)], ResourceKind.LOAD) == Resource.load(1, 2)
    with pytest.raises(ResourceTypeError):
        total([Resource.yarn("", 1, 1, 1)], ResourceKind.LOAD)
