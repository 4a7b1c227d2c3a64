"""The SDK and rmctl in the test's process."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

# The agent the `client` fixture (tests/fixtures/rm.py) registers for the SDK and rmctl tests.
CLIENT_ECM = "h1:9101"


def ctl(rm: Any, *argv: str) -> Awaitable[int]:
    """rmctl against `rm` (anything with a `target`) in a thread; an awaitable of its
    exit code."""
    import rmctl

    return asyncio.to_thread(rmctl.main, ["--rm", rm.target, *argv])


def details(text: str, *, head_only: bool = False) -> dict[str, str]:
    """An rmctl detail view (`key = value` lines) as a dict; every line must be one.
    `head_only`: only the lines before the first blank one (views that list more below)."""
    out = {}
    for line in (text.split("\n\n")[0] if head_only else text).splitlines():
        key, sep, value = line.partition(" = ")
        assert sep, f"not a key = value line: {line!r}"
        out[key.strip()] = value
    return out
