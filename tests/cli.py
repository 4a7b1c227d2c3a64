"""rmctl as a user runs it: its own process (its own interpreter, signals and exit code)
against a real RM."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from typing import Any

from tests.support.env import ROOT

__all__ = ["rmctl_run", "rmctl_spawn"]


async def rmctl_spawn(
    rm: Any, *argv: str, env: Mapping[str, str] | None = None, stdin: Any = None
) -> asyncio.subprocess.Process:
    """``rmctl --rm <rm's target> ARGV`` started as a process with piped output (`rm`
    None: no --rm)."""
    target = ("--rm", rm.target) if rm is not None else ()
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rmctl",
        *target,
        *argv,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        # Never the contexts of whoever runs the tests (a test gives its own file).
        env={**os.environ, "PYTHONUNBUFFERED": "1", "LABELRM_CONFIG": os.devnull, **(env or {})},
    )


async def rmctl_run(
    rm: Any, *argv: str, deadline: float = 30.0, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """rmctl in a subprocess: (exit code, stdout, stderr). A process still running at the
    deadline is killed and the test fails: rmctl must always exit on its own."""
    proc = await rmctl_spawn(rm, *argv, env=env)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), deadline)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(
            f"rmctl {' '.join(argv)} still running after {deadline}s; printed {out!r} {err!r}"
        ) from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
