"""Waiting for something to happen: polling with a deadline (the one way the tests wait), and for a server to serve."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import serving

Description = str | Callable[[], str]


def _describe(what: Description) -> str:
    return what if isinstance(what, str) else what()


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    *,
    what: Description = "condition",
    interval: float = 0.05,
) -> Any:
    """Poll `predicate` (a plain or an async function) until it returns a truthy value,
    which is returned; at the deadline fail naming `what` (a text, or a function giving
    one then, e.g. the end of a log) and the last value seen.
    The one way the tests wait for something to happen: never a bare sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {_describe(what)} (last: {value!r})")
        await asyncio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    *,
    what: Description = "condition",
    interval: float = 0.1,
) -> Any:
    """`wait_until` for tests without an event loop (blocking between tries)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {_describe(what)} (last: {value!r})")
        time.sleep(interval)


def log_tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file (empty if it is not there yet), for failure messages."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def wait_serving(
    target: str,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    tls_ca: str = "",
) -> None:
    """`bench.serving.wait_serving`, failing with the end of the server's `log`."""
    serving.wait_serving(
        target, timeout, proc, lambda: log_tail(log) if log is not None else "", tls_ca
    )
