"""Periodic background jobs, and the lease that runs each on one replica at a time.

Every replica starts the same jobs (the ticket sweep, the ECM and EngineConn liveness
sweep, the demand planner). Each is safe on several replicas at once (row locks), but
running it everywhere multiplies its cost by the replica count and makes "which replica
acted" unpredictable. A job therefore runs only on the replica that holds its lease, a
row renewed by every pass; when that replica dies (or loses the database, as in a
failover) its lease runs out after `ttl` and the next replica to try takes it over.

Each pass that runs can be reported to an observer (the metrics' pass histogram): the
loop tells it, nothing wraps the jobs themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from rm_server.clock import Clock
from rm_server.errors import Unavailable
from rm_server.store import lease as lease_store
from rm_server.store.db import Database

log = logging.getLogger(__name__)

# Told (job, seconds) after every pass that ran, failed ones included.
PassObserver = Callable[[str, float], object]


@dataclass(frozen=True)
class Lease:
    """This replica's claim on background jobs: `holder` is its replica id."""

    db: Database
    holder: str
    clock: Clock
    ttl: timedelta = timedelta(seconds=5)

    async def hold(self, job: str, interval: float = 0.0) -> bool:
        """Take or renew the lease of `job`, which renews it every `interval` seconds:
        for `ttl` past the next renewal (a lease shorter than the time between two would
        lapse between every pair, and the job hop between replicas); True if this
        replica may run it now."""
        now = self.clock.now()
        until = now + self.ttl + timedelta(seconds=interval)
        return await self.db.run(lambda conn: lease_store.hold(conn, job, self.holder, now, until))


async def run_periodically(
    job: str,
    interval: float,
    run_once: Callable[[], Awaitable[object]],
    lease: Lease | None = None,
    observe: PassObserver | None = None,
) -> None:
    """Run `run_once` every `interval` seconds until cancelled (with a lease, only while
    this replica holds the lease of `job`). A failed pass is logged and the next one runs:
    an unreachable database in one line per outage (and one when it is back), anything
    else with its traceback (a bug).
    `observe`, if given, is told how long each pass that ran took.

    The interval counts from the start of a pass: a pass that took the whole interval
    (a planner round over many due demands) is followed by the next at once."""
    loop = asyncio.get_running_loop()
    running = False
    unavailable_since: float | None = None
    while True:
        started = loop.time()
        try:
            if lease is None or await lease.hold(job, interval):
                if not running and lease is not None:
                    log.info("background job %s: this replica (%s) runs it", job, lease.holder)
                running = True
                await _timed(job, run_once, observe)
            elif running:
                log.info("background job %s: another replica took it over", job)
                running = False
            if unavailable_since is not None:
                log.info(
                    "background job %s: database back after %.1f s",
                    job,
                    loop.time() - unavailable_since,
                )
                unavailable_since = None
        except asyncio.CancelledError:
            raise
        except Unavailable as exc:
            if unavailable_since is None:
                unavailable_since = started
                log.warning("background job %s: %s", job, exc)
        except Exception:
            log.exception("background job %s failed", job)
        await asyncio.sleep(max(0.0, started + interval - loop.time()))


async def _timed(
    job: str, run_once: Callable[[], Awaitable[object]], observe: PassObserver | None
) -> None:
    """One pass of `job`, its duration told to `observe` (even when it fails)."""
    if observe is None:
        await run_once()
        return
    started = time.perf_counter()
    try:
        await run_once()
    finally:
        observe(job, time.perf_counter() - started)
