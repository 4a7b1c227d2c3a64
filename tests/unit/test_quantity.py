"""Quantities in and out, the Kubernetes way."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labelrm_common.quantity import (
    format_bytes,
    format_cpu,
    format_quantity,
    parse_cpu,
    parse_memory,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("1G", 10**9), ("1.5Gi", 3 * 2**29),
        ("1073741824", 2**30), ("4k", 4000), ("4Ki", 4096), ("2GiB", 2 * 2**30), ("1M", 10**6),
    ],
)  # fmt: skip
def test_parse_memory(text: str, value: int) -> None:
    assert parse_memory(text) == value


@pytest.mark.parametrize(("text", "value"), [("500m", 500), ("2", 2000), ("0.5", 500)])
def test_parse_cpu(text: str, value: int) -> None:
    assert parse_cpu(text) == value


@pytest.mark.parametrize("text", ["", "1X", "-1Gi", "0.1", "1.5", "Gi", "1e3"])
def test_bad_memory(text: str) -> None:
    with pytest.raises(ValueError, match="memory quantity"):
        parse_memory(text)


@pytest.mark.parametrize("text", ["", "1.0005", "2 cores", "-1", "5mm"])
def test_bad_cpu(text: str) -> None:
    with pytest.raises(ValueError, match="CPU quantity"):
        parse_cpu(text)


def test_formats() -> None:
    assert format_bytes(24684096 * 1024) == "23.5Gi"  # a 24 GiB node, never 24684096Ki
    assert format_bytes(256 * 2**20) == "256Mi" and format_bytes(512) == "512"
    assert format_cpu(2000) == "2" and format_cpu(500) == "500m" and format_cpu(0) == "0"
    assert format_quantity("yarn.memory_bytes", 2**30) == "1Gi"
    assert format_quantity("instances", 3) == "3" and format_quantity("cpu_millis", 3000) == "3000m"


@given(st.integers(min_value=0, max_value=2**62))
def test_exact_bytes_round_trip(n: int) -> None:
    text = format_bytes(n)
    if "." not in text:
        assert parse_memory(text) == n


@given(st.integers(min_value=0, max_value=10**9))
def test_cpu_round_trip(millis: int) -> None:
    assert parse_cpu(format_cpu(millis)) == millis
