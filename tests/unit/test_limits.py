"""Tests for rm_server.domain.limits: glob matching and most-specific-rule selection."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.labels import LabelError, LabelKey
from rm_server.domain.limits import (
    LabelPattern,
    LimitRule,
    best_limit,
    glob_match,
    matches,
    specificity,
)
from rm_server.domain.resources import Resource

KEY = LabelKey.parse("userCreator=alice-IDE,engineType=spark-3.2.1")


def rule(pattern: str, mem: int = 1) -> LimitRule:
    return LimitRule(LabelPattern.parse(pattern), Resource.memory(mem))


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("*", "", True),
        ("*", "anything", True),
        ("abc", "abc", True),
        ("abc", "abcd", False),
        ("abc", "ab", False),
        ("a*", "a", True),
        ("*-IDE", "alice-IDE", True),
        ("*-IDE", "alice-IDEx", False),
        ("a*c", "abbbc", True),
        ("a*c", "abbbcd", False),
        ("a*b*c", "aXbYbZc", True),
        ("a*b*c", "acb", False),
        ("**", "x", True),
        ("spark-3.*", "spark-3.2.1", True),
        ("spark-3.*", "spark-30", False),  # '.' is literal, not "any char"
        ("a?", "ab", False),  # '?' is literal
        ("a?", "a?", True),
        ("[ab]", "a", False),  # '[' is literal
        ("", "", True),
        ("", "a", False),
    ],
)
def test_glob_match_cases(pattern: str, text: str, expected: bool) -> None:
    assert glob_match(pattern, text) is expected


def _reference(pattern: str, text: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, text, flags=re.DOTALL) is not None


@given(st.text("ab*?.", max_size=8), st.text("ab?.", max_size=10))
def test_glob_match_agrees_with_regex(pattern: str, text: str) -> None:
    assert glob_match(pattern, text) == _reference(pattern, text)


def test_matches_requires_same_keys_in_same_order() -> None:
    assert matches(LabelPattern.parse("userCreator=*,engineType=*"), KEY)
    assert not matches(LabelPattern.parse("engineType=*,userCreator=*"), KEY)
    assert not matches(LabelPattern.parse("userCreator=*"), KEY)
    assert not matches(LabelPattern.parse("userCreator=*,engineType=*,tenant=*"), KEY)
    assert matches(LabelPattern.parse("userCreator=*-IDE,engineType=spark-*"), KEY)
    assert not matches(LabelPattern.parse("userCreator=bob-*,engineType=*"), KEY)


def test_pattern_validation() -> None:
    assert str(LabelPattern.parse("userCreator=*-IDE,engineType=spark-3.2.1")) == (
        "userCreator=*-IDE,engineType=spark-3.2.1"
    )
    for bad in ["", "a=", "=x", "a=b c", "a=x?", "a=[x]", "a=1,a=2", "a", "1a=x", "a=x,"]:
        with pytest.raises(LabelError):
            LabelPattern.parse(bad)
    with pytest.raises(LabelError):
        LabelPattern.parse("k=" + "*" * 300)


def test_specificity_order() -> None:
    def s(p: str) -> tuple[int, int, int]:
        return specificity(LabelPattern.parse(p))

    assert s("a=x,b=y") < s("a=x,b=*")
    assert s("a=x,b=*") < s("a=*,b=*")
    assert s("a=xy*,b=*") < s("a=x*,b=*")
    assert s("a=x*y,b=*") < s("a=x**y,b=*")
    # A fully literal value outranks any number of literal characters inside globs.
    assert s("a=x,b=*") < s("a=*,b=yyyyyyyy*")


def test_literal_value_beats_longer_globs() -> None:
    literal = rule("userCreator=alice-IDE,engineType=*", 1)
    globby = rule("userCreator=alice-*,engineType=spark-3.2.*", 2)
    assert best_limit(KEY, [globby, literal]) == literal


def test_most_specific_wins() -> None:
    exact = rule("userCreator=alice-IDE,engineType=*", 1)
    broad = rule("userCreator=*,engineType=*", 2)
    assert best_limit(KEY, [broad, exact]) == exact
    assert best_limit(KEY, [exact, broad]) == exact

    prefix = rule("userCreator=alice-*,engineType=spark-3.2.1", 3)
    anyuser = rule("userCreator=*,engineType=spark-3.2.1", 4)
    assert best_limit(KEY, [anyuser, prefix, broad]) == prefix

    full = rule("userCreator=alice-IDE,engineType=spark-3.2.1", 5)
    assert best_limit(KEY, [exact, prefix, anyuser, broad, full]) == full


def test_no_match_is_none() -> None:
    assert best_limit(KEY, []) is None
    assert best_limit(KEY, [rule("userCreator=bob-*,engineType=*"), rule("emInstance=*")]) is None


def test_tie_break_is_deterministic() -> None:
    # Same specificity: one literal value, same literal-char count, same star count.
    a = rule("userCreator=*-IDE,engineType=spark-3.2.1", 1)
    b = rule("userCreator=alic*,engineType=spark-3.2.1", 2)
    assert specificity(a.pattern) == specificity(b.pattern)
    winner = min(a, b, key=lambda r: str(r.pattern))
    rules = [a, b]
    for seed in range(5):
        random.Random(seed).shuffle(rules)
        assert best_limit(KEY, rules) == winner
    # Identical patterns (a config mistake) still give an order-independent answer.
    c, d = rule("userCreator=*,engineType=*", 7), rule("userCreator=*,engineType=*", 8)
    assert best_limit(KEY, [c, d]) == best_limit(KEY, [d, c])
