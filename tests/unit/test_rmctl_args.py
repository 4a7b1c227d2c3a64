"""rmctl's pure helpers: durations, resources updated dimension by dimension, the last
lines of a log and the lines stamped since a moment."""

from __future__ import annotations

import argparse
import io
from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labelrm_client import load, load_instance, special
from rmctl.args import parse_duration, resource_update
from rmctl.logs import _stamped_since, _tail_offset


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("30s", 30.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "10 m", "1x", "-5s", "1h-2m"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        parse_duration(text)


def _flags(memory: int | None = None, cpu: int | None = None, instances: int | None = None):
    return argparse.Namespace(memory=memory, cpu=cpu, instances=instances)


def test_a_dimension_not_given_keeps_its_value() -> None:
    assert resource_update(_flags(memory=1), load(4, 2000), "x") == load(1, 2000)
    assert resource_update(_flags(cpu=500), load_instance(4, 2000, 3), "x") == load_instance(
        4, 500, 3
    )
    assert resource_update(_flags(instances=2), load(4, 2000), "x") == load_instance(4, 2000, 2)
    assert resource_update(_flags(), load(4, 2000), "x") is None


def test_nothing_to_keep_names_the_missing_flags() -> None:
    with pytest.raises(ValueError, match=r"^new limit a=b has no --cpu to keep: give --cpu$"):
        resource_update(_flags(memory=1), None, "new limit a=b")
    with pytest.raises(ValueError, match="has no --memory or --cpu to keep"):
        resource_update(_flags(instances=1), special({"gpu": 1}), "limit g")


@given(st.lists(st.text(alphabet="ab \t", max_size=5), max_size=30), st.integers(0, 40),
       st.booleans())  # fmt: skip
def test_tail_offset_starts_the_last_lines(lines: list[str], n: int, final_newline: bool) -> None:
    text = "\n".join(lines) + ("\n" if final_newline and lines else "")
    data = text.encode()
    offset = _tail_offset(io.BytesIO(data), len(data), n)
    tail = data[offset:].decode()
    expected = text.splitlines(keepends=True)[-n:] if n else []
    assert tail == "".join(expected)


def test_tail_offset_reads_blocks_backwards() -> None:
    data = b"".join(b"line %d %s\n" % (i, b"x" * 1000) for i in range(200))  # > 3 blocks
    offset = _tail_offset(io.BytesIO(data), len(data), 150)
    assert data[offset:].startswith(b"line 50 ") and data[offset:].count(b"\n") == 150
    assert _tail_offset(io.BytesIO(data), len(data), None) == 0


def test_lines_stamped_since() -> None:
    now = datetime(2024, 5, 1, 12, 0, 0).astimezone()
    text = (
        "before any stamp\n"
        "2024-05-01 11:00:00,001 INFO old\n"
        "Traceback (old)\n"
        "2024-05-01 11:55:00,000 INFO recent\n"
        "  continued\n"
        "2024-05-01T11:59:59 INFO iso\n"
    )
    assert _stamped_since(text, now - timedelta(minutes=10)) == (
        "2024-05-01 11:55:00,000 INFO recent\n  continued\n2024-05-01T11:59:59 INFO iso\n"
    )
    assert _stamped_since(text, now) == ""
