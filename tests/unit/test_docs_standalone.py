"""The documentation stands alone and does not go stale: no links out of the repository,
and the demand examples use times relative to the submission, which never expire."""

from __future__ import annotations

import re

from tests.support.env import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# An absolute date-time as the condition language writes it: 26-03-01 14:00[:00] or
# 2026-03-01T14:00 (the grammar and the lenient-syntax notes describe the form itself).
_ABSOLUTE = re.compile(r"\b(?:\d{2}|\d{4})-\d{2}-\d{2}[ T]\d{2}:\d{2}")


def test_no_link_leaves_the_repository() -> None:
    for path in DOCS:
        links = re.findall(r"\]\((?:https?:)?//[^)]*\)", path.read_text())
        assert links == [], f"{path.name} links outside the repository: {links}"


def test_demand_examples_use_relative_times() -> None:
    text = (ROOT / "docs" / "demands.md").read_text()
    examples = [
        line
        for line in text.splitlines()
        if ("--when" in line or "time_conditions_text" in line or line.startswith("| `{"))
    ]
    assert len(examples) >= 3
    assert [line for line in examples if _ABSOLUTE.search(line)] == []
