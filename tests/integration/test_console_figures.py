"""The console's figures are the API's, in a real browser against a secured RM with a real
agent: what is left on a label or a node holds back demand reservations as
ListLabelResources, GetEcm and the ECM ranking do; a demand's planned start is GetDemand's
planned_start_time (the reservation starts a lead time earlier); and the admin's
timeline tells two users' demands of the same id apart."""

# ruff: noqa: F811 - the tests take the imported fixtures (browser, console) as arguments
from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import demand_pb2 as dpb
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from rm_server.service import convert
from tests.integration.console_fixtures import (
    browser,  # noqa: F401 - a fixture
    console,  # noqa: F401 - a fixture
    errors_of,
    goto,
    new_page,
    text,
)
from tests.integration.security_fixtures import start_secure_agent
from tests.integration.test_tenant_isolation import SHELL_A, SHELL_B
from tests.support.messages import GiB, lbl, load_instance
from tests.support.refusals import refused
from tests.support.waiting import wait_until

ON_AGENT = ",emInstance=agent1"


def _mem(msg: Any, field: str) -> int:
    return int(convert.resource_from_pb(getattr(msg, field), field).get("memory_bytes"))


async def _submit(srm: Any, who: str, labels: str, demand_id: str, text_: str) -> dpb.Demand:
    stubs = srm.stubs(srm.channel(who))
    req = dpb.SubmitDemandRequest(
        demand_id=demand_id,
        labels=lbl(labels),
        resource=load_instance(GiB, 100, 1),
        time_conditions_text=text_,
    )
    return (await stubs.demands.SubmitDemand(req)).demand


async def test_left_and_planned_start_are_the_apis(
    database_url, tmp_path, sudo_users, browser, agent_factory
):
    from tests.integration.security_fixtures import secure_cluster

    # A lead time of ten minutes: a demand starting in five reserves its capacity now.
    async with secure_cluster(
        database_url, tmp_path, sudo_users, console_listen="127.0.0.1:0",
        demand_lead_time=600.0,
    ) as srm:  # fmt: skip
        await start_secure_agent(srm, agent_factory)
        admin = srm.stubs(srm.channel("root"))
        await _submit(srm, "lrmtest_a", SHELL_A + ON_AGENT, "nightly",
                      "{Start: {Time: [+5m, +30m], Strategy: strict}, Duration: +10m}")  # fmt: skip

        async def reserved() -> Any:
            got = await admin.demands.GetDemand(
                dpb.GetDemandRequest(demand_id="nightly", user="lrmtest_a")
            )
            return got.demand if got.demand.state == dpb.DEMAND_STATE_ALLOCATING else None

        demand = await wait_until(reserved, timeout=20, what="the demand reserving")
        ecm = (await admin.rm.GetEcm(pb.GetEcmRequest(instance="agent1"))).ecm
        records = (
            await admin.rm.ListLabelResources(pb.ListLabelResourcesRequest())
        ).label_resources
        record = next(r for r in records if r.label == "emInstance=agent1")
        assert _mem(record, "reserved_resource") == GiB
        # GetEcm holds the reservation back too, and so does the ECM ranking: 7.5 GiB
        # does not fit what an Apply may still take (7 GiB), and the choice says so.
        assert _mem(ecm, "left_resource") == _mem(record, "left_resource") == 7 * GiB
        big = ec_pb.CreateEngineConnRequest(
            labels=lbl(SHELL_A), params={"memory_bytes": str(7 * GiB + GiB // 2)},
            timeout=Duration(seconds=30),
        )  # fmt: skip
        err = await refused(
            srm.stubs(srm.channel("lrmtest_a")).ecs.CreateEngineConn(big, timeout=60),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "NO_ECM_WITH_CAPACITY",
        )  # fmt: skip
        assert "memory_bytes requested 7.5Gi, available 7Gi" in (err.details() or "")

        page = await new_page(browser, srm, "root")
        await goto(page, srm, "#/overview")
        cell = "[data-testid=totals] tr[data-dim=memory_bytes] td[data-field=left]"
        await page.wait_for_selector(cell)
        ecm_left = sum(_mem(r, "left_resource") for r in records if r.source == "ecm")
        assert await text(page, cell) == str(ecm_left)
        await goto(page, srm, "#/resources?source=ecm")
        cell = "[data-testid=resources-table] tr[data-id='emInstance=agent1'] td[data-field=left]"
        await page.wait_for_selector(cell)
        assert await text(page, cell) == str(_mem(record, "left_resource"))
        await goto(page, srm, "#/nodes/agent1")
        await page.wait_for_selector("[data-testid=node-left]")
        assert await text(page, "[data-testid=node-left]") == str(_mem(ecm, "left_resource"))

        # The planned start is planned_start_time, in the list, on its page and where its
        # bar starts on the timeline; the reservation is drawn before it.
        planned = demand.planned_start_time.ToMilliseconds() / 1000  # a browser's precision
        reserve_from = demand.plan_start_time.ToMilliseconds() / 1000
        assert planned - reserve_from == 600
        await goto(page, srm, "#/demands")
        cell = "[data-testid=demands-table] tr[data-id='lrmtest_a/nightly'] td[data-field=planned_start]"
        await page.wait_for_selector(cell)
        assert await _epoch(page, await text(page, cell)) == planned
        bar = await page.wait_for_selector(
            "[data-testid=timeline] g[data-id='lrmtest_a/nightly'] .tl-plan"
        )
        assert await _epoch(page, await bar.get_attribute("data-start")) == planned
        lead = await page.query_selector(
            "[data-testid=timeline] g[data-id='lrmtest_a/nightly'] .tl-reserve"
        )
        assert lead is not None
        assert float(await lead.get_attribute("x")) < float(await bar.get_attribute("x"))
        await page.click("[data-testid=demands-table] a[href='#/demands/lrmtest_a/nightly']")
        shown = await page.wait_for_selector("[data-testid=planned-start]")
        assert await _epoch(page, await shown.get_attribute("data-value")) == planned
        assert errors_of(page) == []


async def _epoch(page: Any, iso: str) -> float:
    return float(await page.evaluate("iso => Date.parse(iso) / 1000", iso))


async def test_the_admins_timeline_joins_demands_by_user_and_id(console, browser, agent_factory):
    await start_secure_agent(console, agent_factory)
    # Both users have a demand "dup"; A's "after" is ordered after A's own. All charge the
    # node's record, so they share one timeline.
    await _submit(
        console, "lrmtest_a", SHELL_A + ON_AGENT, "dup", "{Start: [+10m, +20m], Duration: +5m}"
    )
    await _submit(
        console, "lrmtest_b", SHELL_B + ON_AGENT, "dup", "{Start: [+1h, +2h], Duration: +5m}"
    )
    await _submit(
        console, "lrmtest_a", SHELL_A + ON_AGENT, "after", "{OrderBy: dup, Duration: +5m}"
    )
    page = await new_page(browser, console, "root")
    await goto(page, console, "#/demands")
    timeline = await page.wait_for_selector("[data-testid=timeline]")
    await page.wait_for_selector("[data-testid=timeline] g[data-id='lrmtest_a/after']")
    rows = {await t.text_content() for t in await timeline.query_selector_all("g[data-id] > text")}
    assert {
        "lrmtest_a/dup (ACCEPTED)",
        "lrmtest_b/dup (ACCEPTED)",
        "lrmtest_a/after (ACCEPTED)",
    } <= rows
    (arrow,) = await timeline.query_selector_all(".tl-arrow")
    assert await arrow.get_attribute("data-from") == "lrmtest_a/dup"
    # Drawn from the end of A's "dup", forward to the start of "after".
    own = await timeline.query_selector("g[data-id='lrmtest_a/dup'] .tl-plan")
    start_x = float(await own.get_attribute("x")) + float(await own.get_attribute("width"))
    path = (await arrow.get_attribute("d")).split()
    assert abs(float(path[0][1:].split(",")[0]) - start_x) < 0.5
    assert float(path[-1].split(",")[0]) >= start_x
    # One time convention, said on the axis.
    axis = await timeline.query_selector(".tl-axis-title")
    assert (await axis.text_content()).startswith("time (UTC, 24-hour)")
    assert errors_of(page) == []
