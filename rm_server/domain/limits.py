"""Wildcard limit rules: which maximum resource applies to a resource-carrying label key.

A pattern looks like a LabelKey but its values may contain '*', which matches any run of
characters (including none). No other character is special, so '[' or '?' in a value could never
be misread as a character class (that is why fnmatch is not used).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from rm_server.domain.labels import MAX_LABEL_LENGTH, LabelError, LabelKey, check_key
from rm_server.domain.resources import Resource

_PATTERN_VALUE_RE = re.compile(r"[A-Za-z0-9_.:@/+*-]+")


@dataclass(frozen=True)
class LabelPattern:
    """An ordered tuple of ``(key, value_glob)`` pairs, e.g. ``userCreator=*-IDE``."""

    labels: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.labels, tuple) or not self.labels:
            raise LabelError("pattern", "a label pattern needs at least one label")
        seen: set[str] = set()
        for i, entry in enumerate(self.labels):
            field = f"pattern[{i}]"
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise LabelError(field, f"expected a (key, value) pair, got {entry!r}")
            key, value = entry
            check_key(key, f"{field}.key")
            if not isinstance(value, str) or not _PATTERN_VALUE_RE.fullmatch(value):
                raise LabelError(
                    f"{field}.value",
                    f"invalid pattern value {value!r}: allowed characters are "
                    "A-Z a-z 0-9 _ . : @ / + - *",
                )
            if len(key) + 1 + len(value) > MAX_LABEL_LENGTH:
                raise LabelError(field, f"longer than {MAX_LABEL_LENGTH} characters")
            if key in seen:
                raise LabelError(f"{field}.key", f"duplicate key {key!r}")
            seen.add(key)

    @classmethod
    def parse(cls, text: str) -> LabelPattern:
        """Parse ``"userCreator=*-IDE,engineType=spark-3.2.1"``."""
        if not isinstance(text, str) or not text:
            raise LabelError("pattern", "pattern must be a non-empty string")
        pairs: list[tuple[str, str]] = []
        for i, part in enumerate(text.split(",")):
            key, sep, value = part.partition("=")
            if not sep:
                raise LabelError(f"pattern[{i}]", f"{part!r} is not of the form key=value")
            pairs.append((key, value))
        return cls(tuple(pairs))

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels)

    def keys(self) -> tuple[str, ...]:
        """The pattern's keys, in order."""
        return tuple(k for k, _ in self.labels)


@dataclass(frozen=True)
class LimitRule:
    """The maximum resource for every label key matching ``pattern``."""

    pattern: LabelPattern
    max_resource: Resource


def glob_match(pattern: str, text: str) -> bool:
    """Full match of ``text`` against ``pattern`` where only '*' is special.

    Greedy two-pointer matching with backtracking to the last '*': O(len(pattern) * len(text))
    worst case, no recursion and no regex (so no catastrophic backtracking).
    """
    p = t = 0
    star = -1  # index of the last '*' seen in pattern
    mark = 0  # position in text that '*' currently extends to
    while t < len(text):
        if p < len(pattern) and pattern[p] == "*":
            star, mark = p, t
            p += 1
        elif p < len(pattern) and pattern[p] == text[t]:
            p += 1
            t += 1
        elif star >= 0:
            # Let the last '*' swallow one more character and retry.
            mark += 1
            p, t = star + 1, mark
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def matches(pattern: LabelPattern, key: LabelKey) -> bool:
    """True iff ``key`` has the same keys in the same order and every value glob matches."""
    if pattern.keys() != key.keys():
        return False
    return all(
        glob_match(glob, label.value)
        for (_, glob), label in zip(pattern.labels, key.labels, strict=True)
    )


def specificity(pattern: LabelPattern) -> tuple[int, int, int]:
    """Sort key: smaller means MORE specific.

    Ranks by more fully-literal values, then more literal (non-'*') characters, then fewer '*'.
    """
    values = [v for _, v in pattern.labels]
    literal_values = sum(1 for v in values if "*" not in v)
    literal_chars = sum(len(v) - v.count("*") for v in values)
    stars = sum(v.count("*") for v in values)
    return (-literal_values, -literal_chars, stars)


def _rule_order(rule: LimitRule) -> tuple[tuple[int, int, int], str, str]:
    # str(pattern) breaks specificity ties; the serialised resource only matters for two rules
    # with an identical pattern (a config mistake) and keeps the choice order-independent.
    return (
        specificity(rule.pattern),
        str(rule.pattern),
        json.dumps(rule.max_resource.to_dict(), sort_keys=True),
    )


def best_limit(key: LabelKey, rules: Iterable[LimitRule]) -> LimitRule | None:
    """The most specific rule matching ``key`` (ties: smallest ``str(pattern)``), or None."""
    candidates = [r for r in rules if matches(r.pattern, key)]
    if not candidates:
        return None
    return min(candidates, key=_rule_order)
