"""Lock order: the planner's rounds take their locks in the order every other transaction
takes them (docs/architecture.md, "Lock order"), so PostgreSQL counts no deadlock when
they meet. Each test holds a round half-way (after its label rows are locked), lets the
other transaction queue behind it, then lets the round go on: taken in another order,
the two wait for each other and PostgreSQL aborts one (pg_stat_database.deadlocks)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from labelrm.v1 import demand_pb2 as dpb

from rm_server.store import demand_reservations
from tests.integration.test_demands import (
    LIMIT,
    plain_apply,
    start_drm,
)
from tests.support.database import deadlocks_counted, deadlocks_so_far
from tests.support.messages import GiB, limit_req, load
from tests.support.rm import stop_in_process
from tests.support.waiting import wait_until


async def _waiting_on_a_lock(url: str, fragment: str) -> bool:
    """Whether a session of the database waits for a lock in a statement containing
    `fragment` (pg_stat_activity)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND position(%s in query) > 0",
            (fragment,),
        )
        row = await cur.fetchone()
    return row is not None and row[0] > 0


async def test_an_allocation_and_a_limit_change_on_its_label_never_deadlock(
    database_url, monkeypatch
):
    """A blocked demand whose label frees is allocated in a round that holds the label's
    row; a SetLabelLimit on that label at the same moment holds the limits' lock and
    waits for the row. The round must not then want the limits' lock (it took it after
    the label rows, where a limit change takes it before them)."""
    drm = await start_drm(database_url)
    before = deadlocks_so_far(database_url)
    try:
        hog = await plain_apply(drm, 4)
        assert hog is not None
        await drm.submit("blocked", 1, "{Start: [NOW, +1h]}")
        await drm.tick()  # reserved, tried, refused: its labels' rows exist
        assert await drm.state("blocked") == dpb.DEMAND_STATE_ALLOCATING
        await drm.release(hog.ticket_id)

        held, go = asyncio.Event(), asyncio.Event()
        allocate = demand_reservations.allocate

        async def held_allocate(conn: Any, d: Any, cmd: Any) -> Any:
            held.set()  # the round holds the label rows now
            await go.wait()
            return await allocate(conn, d, cmd)

        monkeypatch.setattr(demand_reservations, "allocate", held_allocate)
        drm.clock.advance(10)
        round_ = asyncio.create_task(drm.planner.tick())
        await asyncio.wait_for(held.wait(), 60)  # a deadline against a hang, not a measure
        limit = asyncio.ensure_future(
            drm.rm.admin.SetLabelLimit(limit_req(LIMIT, load(8 * GiB, 8000)))
        )
        await wait_until(
            lambda: _waiting_on_a_lock(database_url, "label_resource"),
            30,
            what="SetLabelLimit waiting for the label row the round holds",
        )
        go.set()
        await asyncio.wait_for(asyncio.gather(round_, limit), 60)
        assert await drm.state("blocked") == dpb.DEMAND_STATE_ALLOCATED
        await drm.consistent()
    finally:
        await stop_in_process(drm.rm)
    assert deadlocks_counted(database_url) == before
