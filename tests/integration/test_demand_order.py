"""OrderBy waits, shown and bounded: a demand ordered after an id its user never submits
says what it waits for (GetDemand, rmctl, the console) and FAILS with ORDER_BY_MISSING
at its bound, the end of its window or, without one, the operator's default after its
submission. Driven by the injected clock (test_demands.py): no waiting in real time."""

# ruff: noqa: F811 - the tests take the imported fixture `drm` as their argument

from __future__ import annotations

import asyncio
import contextlib
import io
from datetime import datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp
from labelrm.v1 import demand_pb2 as dpb

from rm_server.console import views
from tests.integration.test_demands import (
    drm,  # noqa: F401 - the fixture the tests name
    start_drm,
)
from tests.support.messages import GiB, lbl, load
from tests.support.rm import stop_in_process
from tests.support.sdk import details

BOUND = 120.0  # demand_order_by_timeout of these tests (seconds of injected time)


def _at(ts: Timestamp, like: datetime) -> datetime:
    return ts.ToDatetime(tzinfo=like.tzinfo)


async def _show(target: str, demand_id: str) -> str:
    import rmctl

    out = io.StringIO()
    argv = ["--rm", target, "demand", "show", demand_id, "--user", "alice"]
    with contextlib.redirect_stdout(out):
        assert await asyncio.to_thread(rmctl.main, argv) == 0
    return out.getvalue()


async def test_an_order_by_on_a_demand_never_submitted_waits_visibly_then_fails(database_url):
    drm = await start_drm(database_url, demand_order_by_timeout=BOUND)
    try:
        t0 = drm.clock.now()
        bound = t0 + timedelta(seconds=BOUND)
        # Another user's c-000 is not alice's: for her it is not submitted.
        await drm.stub.SubmitDemand(
            dpb.SubmitDemandRequest(
                demand_id="c-000",
                user="bob",
                labels=lbl("userCreator=bob-IDE,engineType=spark-3.2.1"),
                resource=load(GiB, 100),
            )
        )
        await drm.submit("after-c", 1, "{OrderBy: c-000, Duration: +8s}")
        await drm.tick()
        d = await drm.get("after-c")
        assert d.state == dpb.DEMAND_STATE_ACCEPTED
        stamp = bound.strftime("%Y-%m-%dT%H:%M:%SZ")
        expected = f"waiting for c-000: not submitted (ORDER_BY_MISSING after {stamp})"
        assert d.waiting == expected
        assert [(w.demand_id, w.state) for w in d.waiting_for] == [
            ("c-000", dpb.DEMAND_STATE_UNSPECIFIED)
        ]
        assert _at(d.order_by_missing_time, t0) == bound
        shown = details(await _show(drm.rm.target, "after-c"), head_only=True)
        assert shown["waiting"] == expected
        listed = await drm.stub.ListDemands(dpb.ListDemandsRequest(user="alice"))
        assert [x.waiting for x in listed.demands] == [expected]
        page = await drm.manager.list_demands(("", ""), 10, "", "alice")
        assert [views.demand(x)["waiting"] for x in page] == [expected]  # the console's

        while drm.clock.now() + timedelta(seconds=10) <= bound:  # up to the bound: waits
            await drm.tick()
            assert await drm.state("after-c") == dpb.DEMAND_STATE_ACCEPTED
        await drm.tick()  # past it
        d = await drm.get("after-c")
        assert d.state == dpb.DEMAND_STATE_FAILED
        assert d.reason.startswith("ORDER_BY_MISSING: OrderBy names c-000, not submitted by")
        assert not d.waiting and not d.waiting_for
        await drm.consistent()
    finally:
        await stop_in_process(drm.rm)


async def test_a_window_bounds_the_wait_and_a_submitted_predecessor_is_shown(drm):
    t0 = drm.clock.now()
    await drm.submit("first", 1, "{Start: [+10m, +10m], Duration: +5m}")
    await drm.submit("second", 1, "{OrderBy: first, Duration: +5m}")
    await drm.submit("orphan", 1, "{OrderBy: gone, Start: [NOW, +2m]}")
    await drm.tick()
    second = await drm.get("second")
    first_end = (t0 + timedelta(minutes=15)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert second.waiting == f"waiting for first: ACCEPTED, planned end {first_end}"
    assert not second.HasField("order_by_missing_time")  # nothing missing: no bound
    orphan = await drm.get("orphan")
    assert orphan.waiting.endswith(
        f"(ORDER_BY_MISSING after {(t0 + timedelta(minutes=2)).strftime('%Y-%m-%dT%H:%M:%SZ')})"
    )
    for _ in range(12):  # T+130s: past the end of its window
        await drm.tick()
    orphan = await drm.get("orphan")
    assert orphan.state == dpb.DEMAND_STATE_FAILED
    assert orphan.reason.startswith("ORDER_BY_MISSING: OrderBy names gone, not submitted")
    assert await drm.state("second") == dpb.DEMAND_STATE_ACCEPTED  # its predecessor exists
    await drm.consistent()
