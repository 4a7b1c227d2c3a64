"""What the console's browser tests share: Debian's chromium driven by Playwright
(nothing downloads a browser), an RM serving the console (secured, or in dev mode on
loopback where everyone is an admin), pages signed in, the JSON endpoints as curl would
call them, and screenshots (with LABELRM_CONSOLE_SCREENSHOTS=dir, into that directory:
how docs/images/ is made)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.security_fixtures import secure_cluster
from tests.support.env import unavailable
from tests.support.rm import start_in_process, stop_in_process

CHROMIUM = "/usr/bin/chromium"
_ERRORS: dict[int, list[str]] = {}  # per page: the JavaScript errors it raised


def _browser_path() -> str:
    """Debian's chromium; in CI its absence fails the test, elsewhere it skips it."""
    if shutil.which(CHROMIUM) is None:
        unavailable(f"{CHROMIUM} is not installed (apt-get install chromium)")
    return CHROMIUM


@pytest.fixture
async def console(database_url, tmp_path, sudo_users):
    """A secured RM (TLS, tokens) serving the console, with a token per test user."""
    async with secure_cluster(
        database_url, tmp_path, sudo_users, console_listen="127.0.0.1:0"
    ) as srm:
        yield srm


@contextlib.asynccontextmanager
async def dev_console(database_url: str, **overrides: Any) -> AsyncIterator[Any]:
    """An RM in dev mode (no tokens, loopback: every caller is an admin) serving the
    console; no agent: ECMs are registered through the API."""
    rm = await start_in_process(database_url, console_listen="127.0.0.1:0", **overrides)
    try:
        yield rm
    finally:
        await stop_in_process(rm)


@pytest.fixture
async def browser():
    from playwright.async_api import async_playwright

    path = _browser_path()
    async with async_playwright() as p:
        # --no-sandbox: the tests run as root, where chromium's sandbox refuses to start
        b = await p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


def url_of(rm: Any) -> str:
    return str(rm.server.console.url)


async def new_page(browser: Any, rm: Any, who: str | None = None) -> Any:
    """A page of a fresh browser context on the console, signed in with `who`'s token
    (None: dev mode, no sign-in). JavaScript errors fail the test that reads them
    (`errors_of`)."""
    ctx = await browser.new_context(
        ignore_https_errors=True, viewport={"width": 1400, "height": 900}
    )
    page = await ctx.new_page()
    errors = _ERRORS.setdefault(id(page), [])
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(url_of(rm))
    if who is not None:
        await page.fill("input[name=token]", rm.pki.tokens[who])
        await page.click("button[type=submit]")
    await page.wait_for_selector("[data-testid=who]")
    return page


def errors_of(page: Any) -> list[str]:
    return list(_ERRORS.get(id(page), []))


async def goto(page: Any, rm: Any, route: str) -> None:
    """Open the console's `route` (``#/...``) in `page`."""
    await page.goto(url_of(rm) + route)


def get_blocking(
    rm: Any, path: str, token: str | None, method: str = "GET"
) -> tuple[int, Any, int]:
    """(status, JSON, size in bytes) of a console endpoint, as curl would call it."""
    context = None
    if hasattr(rm, "pki"):
        context = ssl.create_default_context(cafile=rm.pki.ca)
        context.check_hostname = False
    req = urllib.request.Request(url_of(rm).rstrip("/") + path, method=method)
    if method == "POST":  # as the console's page sends a change (rm_server/console/guard.py)
        req.add_header("Origin", url_of(rm).rstrip("/"))
        req.add_header("X-Labelrm-Console", "1")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=context, timeout=20) as r:
            data = r.read()
            return r.status, json.loads(data), len(data)
    except urllib.error.HTTPError as err:
        data = err.read() or b"{}"
        return err.code, json.loads(data), len(data)


async def get(rm: Any, path: str, token: str | None = None) -> tuple[int, Any]:
    """A console endpoint's status and JSON, from a thread: the console serves on this
    test's event loop."""
    status, body, _ = await asyncio.to_thread(get_blocking, rm, path, token)
    return status, body


async def post(rm: Any, path: str, token: str | None = None) -> tuple[int, Any]:
    status, body, _ = await asyncio.to_thread(get_blocking, rm, path, token, "POST")
    return status, body


async def text(page: Any, selector: str) -> str:
    """An element's data-value, else its text ("" when there is none)."""
    el = await page.query_selector(selector)
    return (await el.get_attribute("data-value") or await el.inner_text()) if el else ""


async def shot(page: Any, out: Path, name: str) -> None:
    """A full-page screenshot to `out`/name.png, and to LABELRM_CONSOLE_SCREENSHOTS as
    console-<name>.png when that is set."""
    await page.screenshot(path=str(out / f"{name}.png"), full_page=True)
    docs = os.environ.get("LABELRM_CONSOLE_SCREENSHOTS")
    if docs:
        shutil.copy(out / f"{name}.png", Path(docs) / f"console-{name}.png")
