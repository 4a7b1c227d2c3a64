"""A web page the console's user visits, against the console. `rm-server --dev` serves
the console without authentication (every request is an admin's), so a page that can
make the developer's browser reach it can read every ticket (DNS rebinding: the
attacker's name pointed at 127.0.0.1) and kill EngineConns or cordon the node (a
cross-site form POST).
Each attack runs as written: as raw HTTP with the headers a browser sends, and in a
real browser (Debian's chromium, resolving the attacker's names to 127.0.0.1). Then
text a tenant stored with control characters, as the console shows it."""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import engine_conn_pb2_grpc, resource_manager_pb2_grpc
from labelrm.v1 import resource_manager_pb2 as pb

from bench.serving import free_port
from tests.integration.console_fixtures import _browser_path, browser, console, new_page, url_of
from tests.integration.security_fixtures import engine_conn_of
from tests.integration.test_dev_mode import dev_env, stop
from tests.integration.test_security_escapes import ESCAPES
from tests.support.env import ROOT, shared_tmp
from tests.support.messages import lbl
from tests.support.waiting import log_tail, wait_serving, wait_until_sync

__all__ = ["browser", "console"]  # the fixtures of console_fixtures.py, used here too

USER = "lrmtest_a"
REBIND = "rebind.attacker.example"
EVIL = "evil.example"


@dataclass
class DevRM:
    target: str
    console: str  # http://127.0.0.1:PORT/
    log: Path

    @property
    def console_port(self) -> int:
        return int(self.console.rstrip("/").rpartition(":")[2])


@pytest.fixture(scope="module")
def dev_rm(sudo_users, ec_python) -> Iterator[DevRM]:
    """`rm-server --dev --console-listen 127.0.0.1:PORT` as root (the README's `make run`),
    its local agent launching EngineConns as USER."""
    root = shared_tmp("lrm-console-dev-")
    port = free_port()
    log = root / "dev.log"
    env = dev_env(LABELRM_DEV_USERS=USER, LABELRM_EC_VENV=str(Path(ec_python).parent.parent))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rm_server", "--dev", "--data-dir", str(root / "data"),
         "--listen", f"127.0.0.1:{port}", "--console-listen", f"127.0.0.1:{free_port()}"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        wait_serving(f"127.0.0.1:{port}", 90, proc, log)
        wait_until_sync(
            lambda: re.search(r"web console: (http://\S+)", log.read_text()),
            30,
            what=lambda: "the console's address\n" + log_tail(log),
        )
        found = re.search(r"web console: (http://\S+)", log.read_text())
        assert found is not None
        yield DevRM(f"127.0.0.1:{port}", found.group(1), log)
    finally:
        stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def local_node(rm: DevRM) -> pb.Ecm:
    """The dev RM's local agent, once it is RUNNING."""
    with grpc.insecure_channel(rm.target) as channel:
        nodes = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)

        def agent_running() -> pb.Ecm | None:
            ecms = nodes.ListEcms(pb.ListEcmsRequest(), timeout=10).ecms
            return next((e for e in ecms if e.state == pb.ECM_STATE_RUNNING), None)

        found: pb.Ecm = wait_until_sync(
            agent_running, 30, what=lambda: "local-agent RUNNING\n" + log_tail(rm.log)
        )
        return found


def create_engine_conn(rm: DevRM) -> ec_pb.EngineConn:
    """An EngineConn of USER through the dev RM's local agent (it holds a ticket)."""
    local_node(rm)
    with grpc.insecure_channel(rm.target) as channel:
        ecs = engine_conn_pb2_grpc.EngineConnServiceStub(channel)
        request = ec_pb.CreateEngineConnRequest(
            user=USER,
            labels=lbl(f"userCreator={USER}-IDE,engineType=shell-1"),
            timeout=Duration(seconds=60),
        )
        return ecs.CreateEngineConn(request, timeout=90).engine_conn


def state_of(rm: DevRM, ec_id: str) -> int:
    with grpc.insecure_channel(rm.target) as channel:
        ecs = engine_conn_pb2_grpc.EngineConnServiceStub(channel)
        get = ec_pb.GetEngineConnRequest(engine_conn_id=ec_id)
        return int(ecs.GetEngineConn(get, timeout=10).engine_conn.state)


LIVE = (ec_pb.ENGINE_CONN_STATE_IDLE, ec_pb.ENGINE_CONN_STATE_BUSY)


def send(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, Any]:
    """One request as a browser would send it (the headers given; urllib keeps a Host
    header it is given)."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw or b"{}")
    except ValueError:
        return status, raw.decode(errors="replace")


def test_a_rebound_name_and_a_cross_site_post_get_nothing_from_the_dev_console(dev_rm):
    ec = create_engine_conn(dev_rm)
    port = dev_rm.console_port
    tickets = dev_rm.console + "api/tickets"
    # The attacker's name, now resolving to 127.0.0.1: the browser sends its Host.
    for path in ("api/tickets", "", "api/engineconns"):
        status, body = send(dev_rm.console + path, headers={"Host": f"{REBIND}:{port}"})
        assert status == 421, (path, body)
        assert ec.ticket_id not in json.dumps(body) and ec.engine_conn_id not in json.dumps(body)
    # The console's own addresses are served.
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        status, body = send(tickets, headers={"Host": host})
        assert status == 200 and ec.ticket_id in {t["id"] for t in body["rows"]}

    # A form on another site POSTs to the kill action: refused, the EngineConn lives.
    kill = dev_rm.console + f"api/engineconns/{ec.engine_conn_id}/kill"
    own = f"http://127.0.0.1:{port}"
    for headers in cross_site_posts(own):
        status, body = send(kill, "POST", headers, b"confirm=yes")
        assert status == 403, (headers, body)
        assert state_of(dev_rm, ec.engine_conn_id) in LIVE
    # What the console's page sends is taken.
    status, body = send(kill, "POST", {"Origin": own, "X-Labelrm-Console": "1"})
    assert status == 200 and body["engine_conn"]["id"] == ec.engine_conn_id


def cross_site_posts(own: str) -> tuple[dict[str, str], ...]:
    """The headers of a POST the console must refuse: a form on another site, with and
    without the console's header, an opaque origin, no origin, its own origin without it."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    return (
        {**form, "Origin": f"http://{EVIL}"},
        {**form, "Origin": f"http://{EVIL}", "X-Labelrm-Console": "1"},  # a preflight refused
        {**form, "Origin": "null", "X-Labelrm-Console": "1"},
        {**form, "X-Labelrm-Console": "1"},  # no Origin at all
        {**form, "Origin": own},  # its own origin, but no header: not the console's page
    )


def cordoned(rm: DevRM, instance: str) -> bool:
    with grpc.insecure_channel(rm.target) as channel:
        nodes = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        ecms = nodes.ListEcms(pb.ListEcmsRequest(), timeout=10).ecms
        return any(e.instance == instance and e.cordoned for e in ecms)


def test_a_cross_site_post_cordons_no_node_of_the_dev_console(dev_rm):
    """The node actions are changes like the kill: a form on another site cannot cordon
    the developer's node (no new EngineConn would start there)."""
    node = local_node(dev_rm).instance
    assert not cordoned(dev_rm, node)
    port = dev_rm.console_port
    cordon = dev_rm.console + f"api/nodes/{node}/cordon?reason=evil"
    uncordon = dev_rm.console + f"api/nodes/{node}/uncordon"
    own = f"http://127.0.0.1:{port}"
    for headers in cross_site_posts(own):
        status, body = send(cordon, "POST", headers, b"confirm=yes")
        assert status == 403, (headers, body)
        assert not cordoned(dev_rm, node), headers
    # A page at a rebound name is its own origin, so its script may send the header: the
    # Host names no address of the console.
    rebound = f"{REBIND}:{port}"
    headers = {"Host": rebound, "Origin": f"http://{rebound}", "X-Labelrm-Console": "1"}
    status, body = send(cordon, "POST", headers)
    assert status == 421, body
    assert not cordoned(dev_rm, node)
    # What the console's page sends is taken, both ways (the node is left as it was, for
    # the module's other tests).
    page = {"Origin": own, "X-Labelrm-Console": "1"}
    try:
        status, body = send(cordon, "POST", page)
        assert status == 200 and body["node"]["cordoned"], body
        assert cordoned(dev_rm, node)
    finally:
        status, body = send(uncordon, "POST", page)
    assert status == 200 and not body["node"]["cordoned"], body
    assert not cordoned(dev_rm, node)


class _EvilSite:
    """The attacker's page: a form that POSTs itself to the console's kill action."""

    def __init__(self, action: str) -> None:
        page = (
            f'<form id="f" method="POST" action="{action}"><input name="confirm" value="yes">'
            '</form><script>document.getElementById("f").submit()</script>'
        ).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_a_page_in_the_browser_gets_nothing_from_the_dev_console(dev_rm):
    from playwright.async_api import async_playwright

    ec = await asyncio.to_thread(create_engine_conn, dev_rm)
    port = dev_rm.console_port
    kill = f"http://127.0.0.1:{port}/api/engineconns/{ec.engine_conn_id}/kill"
    evil = _EvilSite(kill)
    rules = f"MAP {REBIND} 127.0.0.1, MAP {EVIL} 127.0.0.1"
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(
                executable_path=_browser_path(),
                headless=True,
                args=["--no-sandbox", f"--host-resolver-rules={rules}"],
            )
            try:
                page = await (await browser.new_context()).new_page()
                # The attacker's page submits its form to the console.
                async with page.expect_response(kill) as posted:
                    await page.goto(f"http://{EVIL}:{evil.port}/")
                assert (await posted.value).status == 403
                assert await asyncio.to_thread(state_of, dev_rm, ec.engine_conn_id) in LIVE
                # DNS rebinding: the attacker's origin, served by the console.
                response = await page.goto(f"http://{REBIND}:{port}/api/tickets")
                assert response is not None and response.status == 421
                assert ec.ticket_id not in await page.content()
                # The console's own page kills it (its kill button sends what is needed).
                page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
                await page.goto(dev_rm.console + f"#/engineconns/{ec.engine_conn_id}")
                async with page.expect_response(kill) as posted:
                    await page.click("[data-testid=kill]")
                assert (await posted.value).status == 200
            finally:
                await browser.close()
    finally:
        evil.close()


async def test_the_console_writes_stored_control_characters_out(console, browser):
    """An EngineConn's own report stored its reason with terminal escapes and a
    bidirectional override: the console's JSON and page show each written out."""
    cert = await engine_conn_of(console, "ec-text", "lrmtest_a")
    ec = console.stubs(console.channel(cert=cert, agent_port=True))
    reason = "boom" + ESCAPES + "\u202egpj.exe"
    await ec.ecs.ReportEngineConnState(
        ec_pb.ReportEngineConnStateRequest(
            engine_conn_id="ec-text", state=ec_pb.ENGINE_CONN_STATE_FAILED, reason=reason
        ),
        timeout=30,
    )
    shown = "boom\\x1b]0;you have been pwned\\x07\\x1b[2J\\u202egpj.exe"
    page = await new_page(browser, console, "root")
    await page.goto(url_of(console) + "#/engineconns/ec-text")
    await page.wait_for_selector("text=reason:")
    text = await page.inner_text("main")
    assert shown in text
    for char in ("\x1b", "\x07", "\u202e"):
        assert char not in await page.content()
