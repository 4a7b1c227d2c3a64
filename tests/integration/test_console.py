"""The web console in a real browser (Debian's chromium, headless, driven by Playwright;
nothing downloads a browser) against a real, secured RM with a real agent that launches
EngineConns through sudo: the overview's figures are CheckConsistency's and
ListLabelResources', an EngineConn created through the API appears without a reload,
and a user's token shows neither the page nor the JSON of another user's EngineConns,
tickets or demands. (The screenshots in docs/images are test_console_ops.py's.)"""

# ruff: noqa: F811 - the tests take the imported fixtures (browser, console) as arguments
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import admin_pb2, external_pb2
from labelrm.v1 import demand_pb2 as demand_pb
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from labelrm_common import tokens
from rm_server.config import Settings
from rm_server.security.setup import SecurityConfigError, build_security
from rm_server.service import convert
from tests.integration.console_fixtures import (
    browser,  # noqa: F401 - a fixture
    console,  # noqa: F401 - a fixture
    errors_of,
    get,
    new_page,
    post,
    text,
    url_of,
)
from tests.integration.security_fixtures import make_pki, start_secure_agent
from tests.integration.test_tenant_isolation import SHELL_A, SHELL_B
from tests.support.messages import lbl, limit_req, load_instance
from tests.support.waiting import wait_until

PAGES = ("overview", "nodes", "engineconns", "resources", "tickets", "demands", "usage")


def _url(srm: Any) -> str:
    return url_of(srm)


async def _signed_in(browser: Any, srm: Any, who: str) -> Any:
    return await new_page(browser, srm, who)


async def _get(srm: Any, path: str, token: str | None) -> tuple[int, Any]:
    return await get(srm, path, token)


async def _post(srm: Any, path: str, token: str | None) -> tuple[int, Any]:
    return await post(srm, path, token)


async def _create(srm: Any, who: str, labels: str) -> str:
    stubs = srm.stubs(srm.channel(who))
    req = ec_pb.CreateEngineConnRequest(labels=lbl(labels), timeout=Duration(seconds=30))
    ec = (await stubs.ecs.CreateEngineConn(req, timeout=60)).engine_conn
    return str(ec.engine_conn_id)


async def _text(page: Any, selector: str) -> str:
    return await text(page, selector)


async def test_console_pages_show_the_api_figures_live(console, browser, agent_factory, tmp_path):
    await start_secure_agent(console, agent_factory)
    admin = console.stubs(console.channel("root"))
    page = await _signed_in(browser, console, "root")
    shots = tmp_path / "screenshots"
    shots.mkdir()

    await admin.admin.SetLabelLimit(
        limit_req("userCreator=*-IDE,engineType=shell-1", load_instance(4 * 1024**3, 4000, 4))
    )

    # An EngineConn created through the API appears on the open list without a reload.
    await page.goto(_url(console) + "#/engineconns")
    await page.wait_for_selector("[data-testid=ecs-table]")
    await page.evaluate("window.__not_reloaded = true")
    ec_id = await _create(console, "lrmtest_a", SHELL_A)
    await page.wait_for_selector(f"[data-testid=ecs-table] tr[data-id='{ec_id}']", timeout=20_000)
    assert await page.evaluate("window.__not_reloaded === true")

    # The overview's figures are the API's: CheckConsistency's counts and the sum of
    # ListLabelResources' ECM records (polled: the page re-reads every two seconds).
    await page.goto(_url(console) + "#/overview")
    await page.wait_for_selector("[data-testid=consistency]")

    async def figures_match() -> bool:
        report = await admin.admin.CheckConsistency(admin_pb2.CheckConsistencyRequest())
        records = (
            await admin.rm.ListLabelResources(pb.ListLabelResourcesRequest(source="ecm"))
        ).label_resources
        want = {
            "labels-checked": str(report.labels_checked),
            "tickets-checked": str(report.tickets_checked),
            "mismatches": str(len(report.mismatches)),
        }
        for key, value in want.items():
            if await _text(page, f"[data-testid={key}]") != value:
                return False
        fields = {"max": "max_resource", "used": "used_resource", "locked": "locked_resource",
                  "left": "left_resource"}  # fmt: skip
        for field, wire in fields.items():
            total = sum(
                convert.resource_from_pb(getattr(r, wire), wire).get("memory_bytes")
                for r in records
                if r.HasField(wire)
            )
            cell = f"[data-testid=totals] tr[data-dim=memory_bytes] td[data-field={field}]"
            if await _text(page, cell) != str(total):
                return False
        return bool(report.tickets_checked >= 1)

    await wait_until(figures_match, timeout=20)
    assert await _text(page, "[data-testid=nodes-by-state] .big") == "1"
    await page.screenshot(path=str(shots / "overview.png"), full_page=True)

    # External providers are listed for admins, without their credentials.
    await admin.admin.PutExternalProvider(
        admin_pb2.PutExternalProviderRequest(
            provider=external_pb2.ExternalProvider(
                name="prod-yarn", type="yarn", cluster="prod",
                addresses=["http://127.0.0.1:9"], auth="basic", username="rm",
                password="s3cret",
            )
        )
    )  # fmt: skip
    status, body = await _get(console, "/api/resources", console.pki.tokens["root"])
    assert status == 200 and [p["name"] for p in body["providers"]] == ["prod-yarn"]
    assert "s3cret" not in json.dumps(body)

    # Resources: the limit that applies to each label, live tickets by user.
    await page.goto(_url(console) + "#/resources")
    row = await page.wait_for_selector(
        "[data-testid=resources-table] tr[data-id='userCreator=lrmtest_a-IDE,engineType=shell-1']"
    )
    assert "userCreator=*-IDE,engineType=shell-1" in await row.inner_text()
    assert await page.query_selector("[data-testid=by-user] tr[data-id=lrmtest_a]")
    assert await page.query_selector("[data-testid=by-engine-type] tr[data-id=shell-1]")
    assert await page.query_selector("[data-testid=providers-table] tr[data-id=prod-yarn]")

    # Demands on the timeline: windows, planned durations, an OrderBy arrow.
    alice = console.stubs(console.channel("lrmtest_a"))
    for demand_id, conditions in (
        ("build", "{Start: [+10m, +30m], Duration: +20m}"),
        ("report", "{OrderBy: build, Duration: +10m}"),
    ):
        await alice.demands.SubmitDemand(
            demand_pb.SubmitDemandRequest(
                demand_id=demand_id,
                labels=lbl(SHELL_A),
                resource=load_instance(256 * 1024**2, 100, 1),
                time_conditions_text=conditions,
            )
        )
    await page.goto(_url(console) + "#/demands")
    await page.wait_for_selector("[data-testid=demands-table] tr[data-id='lrmtest_a/report']")
    timeline = await page.wait_for_selector("[data-testid=timeline]")
    assert {"lrmtest_a/build (ACCEPTED)", "lrmtest_a/report (ACCEPTED)"} <= {
        await t.text_content() for t in await timeline.query_selector_all("g[data-id] > text")
    }
    assert len(await timeline.query_selector_all(".tl-arrow")) == 1

    # Every page renders (no error), ids link to their pages.
    for name in PAGES[1:]:
        await page.goto(_url(console) + f"#/{name}")
        await page.wait_for_selector("table")
        assert await page.query_selector("[data-testid=error]") is None, name
        await page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    await page.goto(_url(console) + "#/nodes")
    await page.click("a[href='#/nodes/agent1']")
    await page.wait_for_selector(f"[data-testid=node-ecs-table] tr[data-id='{ec_id}']")
    isolation = await page.wait_for_selector("[data-testid=isolation]")
    assert "cgroup-v1 (memory, cpu, cpuacct, pids, freezer)" in await isolation.text_content()
    await page.screenshot(path=str(shots / "node.png"), full_page=True)
    await page.click(f"a[href='#/engineconns/{ec_id}']")
    await page.wait_for_selector("[data-testid=choices-table] tr[data-id]")
    # Requested, granted and measured side by side (measured once the agent has read it).
    await page.wait_for_function(
        "document.querySelector('[data-testid=ec-resources]')"
        "?.textContent.includes('measured: memory')",
        timeout=20_000,
    )
    card = await (await page.wait_for_selector("[data-testid=ec-resources]")).text_content()
    for kind in ("requested", "granted"):
        assert f"{kind}: memory 256 MiB, cpu 0.5 cores, instances 1" in card, card
    await page.screenshot(path=str(shots / "engineconn.png"), full_page=True)
    assert await page.evaluate("window.__not_reloaded === true")
    assert errors_of(page) == []
    await admin.ecs.KillEngineConn(ec_pb.KillEngineConnRequest(engine_conn_id=ec_id))


async def test_a_user_sees_only_their_own_engineconns(console, browser, agent_factory):
    await start_secure_agent(console, agent_factory)
    a_ec = await _create(console, "lrmtest_a", SHELL_A)
    b_ec = await _create(console, "lrmtest_b", SHELL_B)
    a_token, b_token = (console.pki.tokens[u] for u in ("lrmtest_a", "lrmtest_b"))

    # The JSON endpoints: B's list holds B's EngineConn only; A's, by its id, answers as
    # an id nobody has (a 403 told B which ids exist).
    status, body = await _get(console, "/api/engineconns", b_token)
    assert status == 200 and [e["id"] for e in body["rows"]] == [b_ec]
    unknown = a_ec[:-3] + "zzz"
    for path in ("/api/engineconns/{}", "/api/engineconns/{}/kill"):
        call = _post if path.endswith("kill") else _get
        hers = await call(console, path.format(a_ec), b_token)
        nobodys = await call(console, path.format(unknown), b_token)
        assert hers[0] == nobodys[0] == 404 and "lrmtest_a" not in hers[1]["error"]
        assert hers[1]["error"].replace(a_ec, "ID") == nobodys[1]["error"].replace(unknown, "ID")
    status, body = await _get(console, "/api/engineconns?user=lrmtest_a", b_token)
    assert status == 403
    status, body = await _get(console, "/api/tickets", b_token)
    assert status == 200 and {t["user"] for t in body["rows"]} == {"lrmtest_b"}
    assert (await _get(console, "/api/tickets?user=lrmtest_a", b_token))[0] == 403
    status, body = await _get(console, "/api/nodes/agent1", b_token)
    assert status == 200 and [e["id"] for e in body["engine_conns"]] == [b_ec]
    status, body = await _get(console, "/api/overview", b_token)
    assert status == 200 and body["consistency"] is None and body["tickets_by_user"] == {}
    assert sum(body["engine_conns"].values()) == 1
    # Demands too: A's demand is in A's list only (demand ids are per user).
    await console.stubs(console.channel("lrmtest_a")).demands.SubmitDemand(
        demand_pb.SubmitDemandRequest(
            demand_id="nightly",
            labels=lbl(SHELL_A),
            resource=load_instance(256 * 1024**2, 100, 1),
            time_conditions_text="{Start: [+1h, +1h]}",
        )
    )
    assert (await _get(console, "/api/demands", b_token))[1]["rows"] == []
    a_demands = (await _get(console, "/api/demands", a_token))[1]["rows"]
    assert [d["id"] for d in a_demands] == ["lrmtest_a/nightly"]
    assert (await _get(console, "/api/demands/lrmtest_a/nightly", b_token))[0] == 403
    status, body = await _get(console, "/api/demands/lrmtest_a/nightly", a_token)
    assert status == 200 and body["demand"]["events"][-1]["to"] == "NEW"
    # A sees A's own; an admin sees both; no token, or a wrong one, sees nothing.
    status, body = await _get(console, f"/api/engineconns/{a_ec}", a_token)
    assert status == 200 and body["engine_conn"]["user"] == "lrmtest_a"
    assert "secret" not in body["engine_conn"]
    # A's ticket, events and logs follow GetTicket's and GetEngineConn's rules.
    a_ticket = body["engine_conn"]["ticket_id"]
    assert (await _get(console, f"/api/tickets/{a_ticket}", a_token))[0] == 200
    for path, unknown in (
        (f"/api/tickets/{a_ticket}", f"/api/tickets/{a_ticket[:-3]}zzz"),
        (f"/api/engineconns/{a_ec}/logs", f"/api/engineconns/{a_ec[:-3]}zzz/logs"),
    ):
        hers, nobodys = await _get(console, path, b_token), await _get(console, unknown, b_token)
        assert hers[0] == nobodys[0] == 404 and "lrmtest_a" not in hers[1]["error"]
    status, body = await _get(console, "/api/engineconns", console.pki.tokens["root"])
    assert {e["id"] for e in body["rows"]} == {a_ec, b_ec}
    assert (await _get(console, "/api/engineconns", None))[0] == 401
    assert (await _get(console, "/api/engineconns", "lrm_not-a-token"))[0] == 401
    assert (await _get(console, "/api/nosuch", b_token))[0] == 404
    # The node actions are the admins' (CordonEcm, UncordonEcm, DecommissionEcm).
    for action in ("cordon", "uncordon", "decommission"):
        status, body = await _post(console, f"/api/nodes/agent1/{action}", b_token)
        assert status == 403, (action, body)
    status, body = await _get(console, "/api/nodes/agent1", b_token)
    assert body["may_act"] is False and body["node"]["cordoned"] is False

    # The pages: B's list shows B's EngineConn and not A's; A's page shows the refusal.
    page = await _signed_in(browser, console, "lrmtest_b")
    await page.goto(_url(console) + "#/engineconns")
    await page.wait_for_selector(f"[data-testid=ecs-table] tr[data-id='{b_ec}']")
    assert await page.query_selector(f"tr[data-id='{a_ec}']") is None
    assert a_ec not in await page.content()
    await page.goto(_url(console) + f"#/engineconns/{a_ec}")
    error = await page.wait_for_selector("[data-testid=error]")
    assert "404" in await error.inner_text()
    assert "lrmtest_a" not in await page.content()

    # The kill action follows KillEngineConn's rule: not another user's (A's stays
    # live), the owner's own, an admin's anyone's; no token, no kill.
    assert (await _post(console, f"/api/engineconns/{a_ec}/kill", None))[0] == 401
    status, body = await _get(console, f"/api/engineconns/{a_ec}", a_token)
    assert body["engine_conn"]["state"] in ("IDLE", "BUSY")
    # A kills A's own from the page (its button, the confirmation accepted).
    page_a = await _signed_in(browser, console, "lrmtest_a")
    page_a.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await page_a.goto(_url(console) + f"#/engineconns/{a_ec}")
    await page_a.click("[data-testid=kill]")

    async def ended(ec_id: str, token: str) -> bool:
        body = (await _get(console, f"/api/engineconns/{ec_id}", token))[1]
        return body["engine_conn"]["state"] in ("SHUTTING_DOWN", "SUCCEEDED", "FAILED")

    await wait_until(lambda: ended(a_ec, a_token), timeout=20)
    status, body = await _post(console, f"/api/engineconns/{b_ec}/kill", console.pki.tokens["root"])
    assert status == 200
    await wait_until(lambda: ended(b_ec, b_token), timeout=20)


def test_the_console_listener_follows_the_tls_rule(tmp_path):
    """Off loopback the console needs TLS (or --insecure), authentication, and tokens to
    sign in with; rm-server refuses to start otherwise."""
    token_file = tmp_path / "tokens.toml"
    tokens.add_token(token_file, "root", ["admin"])
    keys = make_pki(tmp_path / "pki")
    exposed = "0.0.0.0:7180"
    with pytest.raises(SecurityConfigError, match=r"console on non-loopback .* without TLS"):
        build_security(Settings(token_file=str(token_file), console_listen=exposed))
    with pytest.raises(SecurityConfigError, match="authentication off"):
        build_security(Settings(console_listen=exposed))
    with pytest.raises(SecurityConfigError, match="set token_file"):
        build_security(Settings(tls_cert=keys.path("server", "crt"), tls_key=keys.path("server", "key"),
                                console_listen=exposed))  # fmt: skip
    build_security(Settings(token_file=str(token_file), console_listen="127.0.0.1:7180"))
    build_security(Settings(token_file=str(token_file), console_listen=exposed, insecure=True))
