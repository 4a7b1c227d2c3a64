"""The periodic loop (rm_server/app/background.py) tells its observer about every pass it
runs, failed ones too, and the metrics record what they are told."""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CollectorRegistry

from rm_server.app.background import run_periodically
from rm_server.observability.metrics import Metrics


async def test_every_pass_that_ran_is_told_to_the_observer_failed_ones_too() -> None:
    told: list[tuple[str, float]] = []
    passes = 0
    three = asyncio.Event()

    async def run_once() -> None:
        nonlocal passes
        passes += 1
        if passes >= 3:
            three.set()
        if passes == 2:
            raise RuntimeError("a failed pass")

    loop = asyncio.create_task(
        run_periodically("job", 0.001, run_once, None, lambda job, s: told.append((job, s)))
    )
    try:
        await asyncio.wait_for(three.wait(), timeout=10)
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    assert len(told) >= 3
    assert all(job == "job" and seconds >= 0 for job, seconds in told)


def test_the_metrics_record_passes_and_reclaims_they_are_told() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.observe_pass("ticket-sweep", 0.002)
    metrics.observe_pass("ticket-sweep", 0.003)
    metrics.count_reclaims(2)
    count = registry.get_sample_value(
        "labelrm_background_pass_seconds_count", {"job": "ticket-sweep"}
    )
    assert count == 2
    assert registry.get_sample_value("labelrm_lock_expiry_reclaims_total") == 2
