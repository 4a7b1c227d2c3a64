"""What an operator looks for beside Nomad's UI or YARN's ResourceManager UI, in a real
browser against a secured RM with a real agent: tickets and demands have pages of their
own and their ids link there, a demand's transitions are shown, a live EngineConn's logs
can be followed, the overview's counts open the filtered lists, a label's use over the
last hour is charted, ended EngineConns are hidden by default and show why they ended,
a node can be drained from its page and shows its events. The screenshots of every page
(docs/images/console-*.png) are taken here."""

# ruff: noqa: F811 - the tests take the imported fixtures (browser, console) as arguments
from __future__ import annotations

import asyncio
from typing import Any

from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import demand_pb2 as dpb
from labelrm.v1 import engine_conn_pb2 as ec_pb

from tests.integration.console_fixtures import (
    browser,  # noqa: F401 - a fixture
    console,  # noqa: F401 - a fixture
    errors_of,
    goto,
    new_page,
    shot,
)
from tests.integration.security_fixtures import start_secure_agent
from tests.integration.test_tenant_isolation import SHELL_A, SHELL_B
from tests.support.messages import lbl, limit_req, load_instance
from tests.support.waiting import wait_until

GiB = 1024**3


async def _create(srm: Any, who: str, labels: str) -> ec_pb.EngineConn:
    stubs = srm.stubs(srm.channel(who))
    req = ec_pb.CreateEngineConnRequest(labels=lbl(labels), timeout=Duration(seconds=30))
    return (await stubs.ecs.CreateEngineConn(req, timeout=60)).engine_conn


async def _first_event(page: Any) -> bool:
    events = await _cells(page, "[data-testid=node-events-table] td:nth-child(2)")
    return bool(events) and events[0] == "UNCORDONED"


async def _cells(page: Any, selector: str) -> list[str]:
    return [
        " ".join((await c.inner_text()).split()) for c in await page.query_selector_all(selector)
    ]


async def test_an_operators_pages_links_logs_and_actions(console, browser, agent_factory, tmp_path):
    await start_secure_agent(console, agent_factory)
    admin = console.stubs(console.channel("root"))
    await admin.admin.SetLabelLimit(
        limit_req("userCreator=*-IDE,engineType=shell-1", load_instance(4 * GiB, 4000, 4))
    )
    ec = await _create(console, "lrmtest_a", SHELL_A)
    await _create(console, "lrmtest_b", SHELL_B)
    alice = console.stubs(console.channel("lrmtest_a"))
    for demand_id, conditions in (
        ("build", "{Start: [+10m, +30m], Duration: +20m}"),
        ("report", "{OrderBy: build, Duration: +10m}"),
    ):
        await alice.demands.SubmitDemand(
            dpb.SubmitDemandRequest(
                demand_id=demand_id, labels=lbl(SHELL_A),
                resource=load_instance(256 * 1024**2, 100, 1), time_conditions_text=conditions,
            )
        )  # fmt: skip
    shots = tmp_path / "screenshots"
    shots.mkdir()
    page = await new_page(browser, console, "root")

    # The overview's counts open the lists they count, filtered.
    await goto(page, console, "#/overview")
    await page.click("[data-testid=ecs-by-state] a[data-state=IDLE]")
    await page.wait_for_selector(f"[data-testid=ecs-table] tr[data-id='{ec.engine_conn_id}']")
    assert page.url.endswith("#/engineconns?state=IDLE")
    assert await _cells(page, "[data-testid=ecs-facets] a.on") == ["IDLE 2"]
    await goto(page, console, "#/overview")
    await page.wait_for_selector("[data-testid=loaded-label] [data-testid=usage-chart]")
    await shot(page, shots, "overview")

    # A ticket's id links to its page: its owner, what it holds, its states, its EngineConn.
    await goto(page, console, "#/tickets?user=lrmtest_a")
    await page.click(f"a[href='#/tickets/{ec.ticket_id}']")
    await page.wait_for_selector("[data-testid=ticket]")
    states = await _cells(page, "[data-testid=ticket-events-table] tbody td:nth-child(2)")
    assert states[-1] == "LOCKED" and ec.engine_conn_id in await page.inner_text(
        "[data-testid=ticket]"
    )
    await shot(page, shots, "ticket")

    # A demand's page, from its id, with its transitions.
    await goto(page, console, "#/demands")
    await page.wait_for_selector("[data-testid=timeline] .tl-arrow")
    await shot(page, shots, "demands")
    await page.click("[data-testid=demands-table] a[href='#/demands/lrmtest_a/report']")
    await page.wait_for_selector("[data-testid=demand-events-table] tbody tr")
    transitions = await _cells(page, "[data-testid=demand-events-table] tbody tr")
    assert "(submitted) NEW" in transitions[-1] and "NEW ACCEPTED" in transitions[-2]
    await page.click("a[href='#/demands/lrmtest_a/build']")  # its OrderBy links on
    await page.wait_for_selector("h1 >> text=Demand build")
    await shot(page, shots, "demand")

    # A label's use over the last hour: the EngineConn's ticket shows on its chart.
    await goto(page, console, "#/resources?q=lrmtest_a")
    chart = await page.wait_for_selector(
        f"[data-testid=resources-table] tr[data-id='{SHELL_A}'] [data-testid=usage-chart]"
    )
    assert float(await chart.get_attribute("data-peak")) > 0
    await shot(page, shots, "resources")

    # The EngineConn's page: its events, and its logs followed as it writes them.
    await goto(page, console, f"#/engineconns/{ec.engine_conn_id}")
    await page.wait_for_selector("[data-testid=ec-events-table] tbody tr")
    assert {"STARTING", "IDLE"} <= set(
        await _cells(page, "[data-testid=ec-events-table] td:nth-child(2)")
    )
    await page.wait_for_selector("[data-testid=logs][data-file='stderr.log']")
    assert "creation context: ec_id=" + ec.engine_conn_id in await page.inner_text(
        "[data-testid=logs][data-file='stderr.log']"
    )
    await page.check("[data-testid=follow-logs]")
    await page.evaluate("window.__not_reloaded = true")
    await shot(page, shots, "engineconn")
    await admin.ecs.KillEngineConn(
        ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id, reason="end of the test")
    )
    # "stopping" is written by the EngineConn after the page started following.
    await page.wait_for_selector("[data-testid=logs] >> text=stopping", timeout=20_000)
    assert await page.evaluate("window.__not_reloaded === true")

    # Ended EngineConns leave the default list, and show why they ended.
    async def ended() -> Any:
        got = await admin.ecs.GetEngineConn(
            ec_pb.GetEngineConnRequest(engine_conn_id=ec.engine_conn_id)
        )
        over = (ec_pb.ENGINE_CONN_STATE_SUCCEEDED, ec_pb.ENGINE_CONN_STATE_FAILED)
        return got.engine_conn if got.engine_conn.state in over else None

    gone = await wait_until(ended, timeout=20, what="the EngineConn ending")
    await goto(page, console, "#/engineconns")
    await page.wait_for_selector("[data-testid=ecs-table] tbody tr[data-id]")
    assert await page.query_selector(f"tr[data-id='{ec.engine_conn_id}']") is None
    await page.click("[data-testid=ecs-facets] a[data-state=ended]")
    row = f"[data-testid=ecs-table] tr[data-id='{ec.engine_conn_id}']"
    await page.wait_for_selector(row)
    assert gone.reason and await page.inner_text(f"{row} td[data-field=reason]") == gone.reason
    await shot(page, shots, "engineconns")

    # The node: its events, and cordon, uncordon and decommission from its page.
    await goto(page, console, "#/nodes")
    await page.wait_for_selector("[data-testid=nodes-table] tr[data-id=agent1]")
    await shot(page, shots, "nodes")
    await page.click("a[href='#/nodes/agent1']")
    await page.wait_for_selector("[data-testid=node-events-table] tbody tr")
    page.on(
        "dialog",
        lambda d: asyncio.ensure_future(
            d.accept("disk swap") if d.type == "prompt" else d.accept()
        ),
    )
    await page.click("[data-testid=cordon]")
    cordon = await page.wait_for_selector("[data-testid=cordon-status]:has-text('disk swap')")
    # B's EngineConn still runs there: the page follows the drain.
    assert "draining: 1 EngineConn still running" in await cordon.inner_text()
    assert (await _cells(page, "[data-testid=node-events-table] td:nth-child(2)"))[0] == "CORDONED"
    await shot(page, shots, "node")
    await goto(page, console, "#/nodes")
    cell = "[data-testid=nodes-table] tr[data-id=agent1] td[data-field=cordon]"
    assert "CORDONED disk swap" in " ".join(
        (await (await page.wait_for_selector(cell)).inner_text()).split()
    )
    await goto(page, console, "#/nodes/agent1")
    await page.click("[data-testid=uncordon]")
    await page.wait_for_selector("[data-testid=cordon-status]", state="detached")
    await wait_until(lambda: _first_event(page), timeout=20, what="the uncordon recorded")
    await page.click("[data-testid=decommission]")
    await page.wait_for_selector("h1 .pill.st-DRAINING")
    events = await _cells(page, "[data-testid=node-events-table] td:nth-child(2)")
    assert events[0] == "DRAINING" and {"UNCORDONED", "CORDONED", "REGISTERED"} <= set(events)
    await goto(page, console, "#/tickets")
    await page.wait_for_selector("[data-testid=tickets-table] tbody tr[data-id]")
    await shot(page, shots, "tickets")
    assert errors_of(page) == []
