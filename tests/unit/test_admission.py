"""Admission against a label maximum: only the dimensions the maximum names count."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.admission import excess_dimensions, label_shortfalls
from rm_server.domain.resources import Resource, ResourceKind

q = st.integers(min_value=0, max_value=2**30)


def test_load_limit_ignores_instances_of_a_load_instance_request():
    maximum = Resource.load(100, 100)
    zero = Resource.zero(ResourceKind.LOAD)
    request = Resource.load_instance(50, 50, 7)
    assert label_shortfalls("l", maximum, zero, zero, zero, request) == []
    big = Resource.load_instance(150, 50, 7)
    shortfalls = label_shortfalls("l", maximum, zero, zero, zero, big)
    assert [(s.dimension, s.requested, s.available) for s in shortfalls] == [
        ("memory_bytes", 150, 100)
    ]


def test_special_absent_names_mean_zero():
    maximum = Resource.special({"gpu": 2})
    zero = Resource.zero(ResourceKind.SPECIAL)
    request = Resource.special({"license": 1})
    shortfalls = label_shortfalls("l", maximum, zero, zero, zero, request)
    assert [s.dimension for s in shortfalls] == ["special.license"]


def test_protected_is_never_available():
    maximum = Resource.load(100, 100)
    zero = Resource.zero(ResourceKind.LOAD)
    protected = Resource.load(30, 0)
    shortfalls = label_shortfalls("l", maximum, zero, zero, protected, Resource.load(71, 1))
    assert [(s.dimension, s.available) for s in shortfalls] == [("memory_bytes", 70)]


@given(q, q, q, q, q, q)
def test_admitted_request_never_exceeds_the_maximum(m, c, um, uc, rm_, rc):
    maximum = Resource.load(m, c)
    used = Resource.load(min(um, m), min(uc, c))
    zero = Resource.zero(ResourceKind.LOAD)
    request = Resource.load(rm_, rc)
    if not label_shortfalls("l", maximum, used, zero, zero, request):
        assert excess_dimensions(maximum, used + request) == []
    else:
        assert excess_dimensions(maximum, used + request) != []
