"""The console's lists in a real browser, against an RM in dev mode with a few thousand
live tickets: a list longer than a page pages through, a list longer than the RM reads
says it is cut and how to see the rest, sums per user count every live ticket, the filter
matches only what a row shows, a malformed address says so; and the RM's work per poll
does not grow with the number of browsers open (each view is computed once per refresh
period for all of them)."""

# ruff: noqa: F811 - the tests take the imported fixtures (browser, console) as arguments
from __future__ import annotations

import asyncio
from typing import Any

from labelrm.v1 import resource_manager_pb2 as pb

from tests.integration.console_fixtures import (
    browser,  # noqa: F401 - a fixture
    dev_console,
    errors_of,
    get_blocking,
    goto,
    new_page,
    text,
)
from tests.support.messages import apply_req, load
from tests.support.waiting import wait_until

ALICE = "userCreator=alice-IDE,engineType=shell-1"
BOB = "userCreator=bob-IDE,engineType=spark-3"
MiB = 1024**2


async def _apply(rm: Any, labels: str, user: str, n: int) -> list[str]:
    """`n` live tickets of `user` (applied 100 at a time: grouped by the RM)."""
    ids: list[str] = []
    for start in range(0, n, 100):
        batch = [
            rm.rm.Apply(apply_req(labels, load(MiB, 1), user=user))
            for _ in range(min(100, n - start))
        ]
        ids += [r.ticket.ticket_id for r in await asyncio.gather(*batch)]
    return ids


async def _count(page: Any, name: str) -> str:
    el = await page.wait_for_selector(f"[data-testid={name}-count]")
    return " ".join((await el.inner_text()).split())


async def test_lists_page_through_say_when_they_are_cut_and_filter_what_they_show(
    database_url, browser
):
    async with dev_console(database_url, console_list_rows=2000) as rm:
        alice = await _apply(rm, ALICE, "alice", 1075)
        await _apply(rm, BOB, "bob", 1075)
        for ticket_id in alice[:10]:
            await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=ticket_id))
        page = await new_page(browser, rm)

        # 2,150 live tickets, the RM reads 2,000: the list says it is cut, and how to see
        # the rest (it never claims "2000 of 2000").
        await goto(page, rm, "#/tickets")
        assert await _count(page, "tickets") == "1\u201350 of 2,000"
        cut = await page.wait_for_selector("[data-testid=tickets-cut]")
        assert "newest 2,000 of 2,150" in await cut.inner_text()
        assert "rmctl ticket list" in await cut.inner_text()
        # Narrowed to one user it is whole, and pages to its last ticket.
        await goto(page, rm, "#/tickets?user=alice")
        await wait_until(lambda: _count(page, "tickets"), what="the count")
        await wait_until(lambda: _is(page, "tickets", "1\u201350 of 1,075"), what="alice's count")
        assert await page.query_selector("[data-testid=tickets-cut]") is None
        await page.click("[data-testid=tickets-last]")
        await wait_until(
            lambda: _is(page, "tickets", "1,051\u20131,075 of 1,075"), what="last page"
        )
        rows = await page.query_selector_all("[data-testid=tickets-table] tbody tr")
        assert len(rows) == 25
        await page.click("[data-testid=tickets-prev]")
        await wait_until(lambda: _is(page, "tickets", "1,001\u20131,050 of 1,075"), what="back")

        # A state facet narrows it (in the database), with its count beside it.
        facet = "[data-testid=tickets-facets] a[data-state=USED]"
        assert " ".join((await page.inner_text(facet)).split()) == "USED 10"
        await page.click(facet)
        await wait_until(lambda: _is(page, "tickets", "1\u201310 of 10"), what="USED only")
        assert "state=USED" in page.url

        # The sums per user count every live ticket, not those a list read.
        await goto(page, rm, "#/resources")
        for user in ("alice", "bob"):
            cell = f"[data-testid=by-user] tr[data-id={user}] td[data-field=tickets]"
            await page.wait_for_selector(cell)
            assert await text(page, cell) == "1075"

        # The filter matches what rows show: USED keeps the ten USED tickets (every
        # ticket has a "used" field, which the filter must not see).
        await goto(page, rm, "#/tickets?user=alice")
        await page.wait_for_selector("[data-testid=tickets-table] tbody tr")
        await page.fill("[data-testid=tickets-filter]", "USED")
        await wait_until(lambda: _is(page, "tickets", "1\u201310 of 10 matching the filter"))
        states = await page.eval_on_selector_all(
            "[data-testid=tickets-table] tbody tr .pill.st-USED, [data-testid=tickets-table] tbody tr .pill.st-LOCKED",
            "els => els.map(e => e.textContent)",
        )
        assert states == ["USED"] * 10
        assert "q=USED" in page.url  # the filtered list is a link

        # Bad list parameters are refused, naming the parameter.
        for path, name in (
            ("/api/tickets?sort=secret", "sort"),
            ("/api/tickets?limit=100000", "limit"),
            ("/api/engineconns?state=BOGUS", "state"),
            ("/api/tickets?q=" + "x" * 201, "q"),
        ):
            status, body, _ = await asyncio.to_thread(get_blocking, rm, path, None)
            assert status == 400 and body["error"].startswith(name), (path, body)

        # A malformed %-escape: the page says the address is not valid (not "Loading…").
        await goto(page, rm, "#/engineconns/%zz")
        error = await page.wait_for_selector("[data-testid=error]")
        assert "not a valid address" in await error.inner_text()
        assert errors_of(page) == []


async def _is(page: Any, name: str, want: str) -> bool:
    return await _count(page, name) == want


async def test_the_rm_computes_a_view_once_per_refresh_however_many_browsers_poll(
    database_url, browser
):
    async with dev_console(database_url) as rm:
        await _apply(rm, ALICE, "alice", 1000)
        console = rm.server.console
        cache = console.cache
        frozen = [0.0]
        cache.clock = lambda: frozen[0]  # time stands still: kept views stay fresh
        checks = _count_calls(rm.server.core.consistency, "check")

        first = await new_page(browser, rm)
        await goto(first, rm, "#/overview")
        await _polled(cache, "overview", 3)
        second = await new_page(browser, rm)
        await goto(second, rm, "#/overview")
        await _polled(cache, "overview", cache.reads["overview"] + 3)
        # Two browsers, six polls and more: one overview, one consistency check.
        assert cache.builds["overview"] == 1 and checks[0] == 1
        for page in (first, second):
            await goto(page, rm, "#/tickets")
        await _polled(cache, "tickets", 4)
        assert cache.builds["tickets"] == 1 and cache.builds["tickets/page"] == 1

        # The next refresh period: one more of each, for both browsers.
        reads = cache.reads["tickets"]
        frozen[0] += console.api.refresh
        await _polled(cache, "tickets", reads + 4)
        assert cache.builds["tickets"] == 2 and cache.builds["tickets/page"] == 2

        # A poll of the tickets list carries its page, not every ticket.
        status, body, size = await asyncio.to_thread(get_blocking, rm, "/api/tickets", None)
        assert status == 200 and len(body["rows"]) == 50 and body["matched"] == 1000
        assert size < 64 * 1024, size


def _count_calls(owner: Any, name: str) -> list[int]:
    """Count the calls of `owner.name` (the real method still runs)."""
    calls = [0]
    real = getattr(owner, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return await real(*args, **kwargs)

    setattr(owner, name, counted)
    return calls


async def _polled(cache: Any, view: str, reads: int) -> None:
    await wait_until(
        lambda: cache.reads[view] >= reads, timeout=30, what=f"{reads} reads of {view}"
    )


async def test_small_use_of_a_large_node_stays_visible(database_url, browser):
    from tests.support.messages import load_instance, register

    async with dev_console(database_url) as rm:
        huge = load_instance(64 * 1024**4, 512_000, 1000)  # 64 TiB, 512 cores
        await rm.rm.RegisterEcm(register("big", huge))
        labels = "emInstance=big,userCreator=alice-IDE,engineType=shell-1"
        await rm.rm.Apply(apply_req(labels, load_instance(1024**3, 1, 1), user="alice"))
        page = await new_page(browser, rm)
        await goto(page, rm, "#/nodes")
        row = "[data-testid=nodes-table] tr[data-id=big]"
        await page.wait_for_selector(f"{row} .bar .locked")
        # 1 GiB of 64 TiB and 1 millicore of 512 cores: still a visible mark on each bar.
        widths = [
            (await seg.bounding_box())["width"]
            for seg in await page.query_selector_all(f"{row} .bar .locked")
        ]
        assert len(widths) == 3 and min(widths) >= 1, widths
        await goto(page, rm, "#/nodes/big")
        capacity = await page.wait_for_selector("[data-testid=capacity]")
        shown = await capacity.inner_text()
        assert "0.001 cores locked" in shown and "0.0 cores" not in shown
        assert "1 GiB locked" in shown
        assert errors_of(page) == []
