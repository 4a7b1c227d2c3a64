"""The usage ledger: exact resource-seconds from known tickets on the manual clock, its
roll-up idempotent across passes, replicas and restarts, and kept after retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from labelrm.v1 import resource_manager_pb2 as pb

from tests.support.messages import GiB, apply_req, limit_req, load

USER = "userCreator=alice-IDE,engineType=spark-3.2.1"
OTHER = "userCreator=bob-IDE,engineType=hive-2.3.3"
LABEL = USER  # the label record each of alice's tickets was charged to
START = datetime(2026, 1, 1, tzinfo=UTC)
US = 1_000_000


async def ledger_rows(rm: Any) -> list[tuple[Any, ...]]:
    async def read(conn: Any) -> list[tuple[Any, ...]]:
        cur = await conn.execute(
            "SELECT hour, user_name, label, tickets, granted, engine_conns, demands_planned"
            " FROM usage_hour ORDER BY hour, user_name, label"
        )
        return list(await cur.fetchall())

    rows: list[tuple[Any, ...]] = await rm.core.db.run(read)
    return rows


async def report(rm: Any, group_by: str = "user", user: str | None = None) -> dict[str, Any]:
    from rm_server.domain.usage import UsageQuery

    query = UsageQuery(group_by, START - timedelta(days=1), START + timedelta(days=3650), user)
    return {g.key: g for g in await rm.core.usage.report(query)}


async def run_known_tickets(rm: Any) -> None:
    """alice: 2 GiB / 500m locked 30 s, then used 1 GiB / 250m for 1 h (crossing an
    hour); a ticket locked 10 s and released unreported; bob: 1 GiB / 100m for 90 s."""
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(64 * GiB, 64000)))
    rm.clock.advance(1800)  # 00:30
    t1 = (await rm.rm.Apply(apply_req(USER, load(2 * GiB, 500)))).ticket
    t2 = (await rm.rm.Apply(apply_req(USER, load(GiB, 1000)))).ticket
    t3 = (await rm.rm.Apply(apply_req(OTHER, load(GiB, 100)))).ticket
    rm.clock.advance(10)
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=t2.ticket_id))
    rm.clock.advance(20)  # 00:30:30
    used = load(GiB, 250)
    await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=t1.ticket_id, used_resource=used))
    rm.clock.advance(60)
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=t3.ticket_id))
    rm.clock.advance(3600 - 60)  # 01:30:30
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=t1.ticket_id))


async def test_known_tickets_give_exact_resource_seconds(rm_manual_clock):
    rm = rm_manual_clock
    await run_known_tickets(rm)
    await rm.core.usage.roll_up()
    by_user = await report(rm)
    alice, bob = by_user["alice"], by_user["bob"]
    # t1: 2 GiB x 30 s locked + 1 GiB x 3600 s used; t2: 1 GiB x 10 s locked.
    assert alice.granted["memory_bytes"] == (2 * GiB * 30 + GiB * 3600 + GiB * 10) * US
    assert alice.granted["cpu_millis"] == (500 * 30 + 250 * 3600 + 1000 * 10) * US
    assert alice.amounts["tickets"] == 2
    assert bob.granted == {"memory_bytes": GiB * 90 * US, "cpu_millis": 100 * 90 * US}
    # By hour: t1's used hour is split at 01:00 (29.5 min before, 30.5 min after).
    by_hour = await report(rm, "hour", "alice")
    first, second = by_hour["2026-01-01T00:00:00Z"], by_hour["2026-01-01T01:00:00Z"]
    assert first.granted["memory_bytes"] == (2 * GiB * 30 + GiB * 1770 + GiB * 10) * US
    assert second.granted["memory_bytes"] == GiB * 1830 * US
    assert (first.amounts["tickets"], second.amounts["tickets"]) == (2, 0)
    # By label: the userCreator+engineType record each was charged to.
    by_label = await report(rm, "label", "alice")
    assert by_label[LABEL].granted == alice.granted


async def test_a_second_pass_and_a_restart_add_nothing(rm_manual_clock, database_url):
    from tests.support.rm import start_in_process, stop_in_process

    rm = rm_manual_clock
    await run_known_tickets(rm)
    assert await rm.core.usage.roll_up() == 3
    before = await ledger_rows(rm)
    assert await rm.core.usage.roll_up() == 0  # nothing new since the watermark
    # Another replica on the same database, and this one restarted: nothing twice.
    other = await start_in_process(database_url, clock=rm.clock, sweep_interval=3600.0)
    try:
        assert await other.core.usage.roll_up() == 0
    finally:
        await stop_in_process(other)
    assert await ledger_rows(rm) == before


async def test_the_ledger_keeps_what_retention_deletes(rm_manual_clock):
    rm = rm_manual_clock
    await run_known_tickets(rm)
    await rm.core.usage.roll_up()
    before = await ledger_rows(rm)
    rm.clock.advance(31 * 86400)
    await rm.core.sweeps.sweep()

    async def history(conn: Any) -> int:
        cur = await conn.execute("SELECT count(*) FROM ticket_history")
        return int((await cur.fetchone())[0])

    assert await rm.core.db.run(history) == 0  # retention deleted the history ...
    assert await ledger_rows(rm) == before  # ... and the ledger kept it, once


async def test_retention_waits_for_the_roll_up(rm_manual_clock):
    """History the ledger does not have yet is not deleted: the retention rolls it up
    first (here no roll-up ran since the tickets ended)."""
    rm = rm_manual_clock
    await run_known_tickets(rm)
    rm.clock.advance(31 * 86400)
    await rm.core.sweeps.sweep()
    by_user = await report(rm)
    assert by_user["bob"].granted == {"memory_bytes": GiB * 90 * US, "cpu_millis": 100 * 90 * US}


async def test_two_replicas_rolling_up_at_once_count_each_ticket_once(database_url):
    """Two replicas end tickets and roll up at the same time, again and again: the
    ledger equals what the history adds, computed once per row."""
    import asyncio

    from rm_server.domain.usage import Amounts
    from rm_server.store import usage as usage_store
    from tests.support.rm import start_in_process, stop_in_process

    first = await start_in_process(database_url, usage_interval=3600.0)
    second = await start_in_process(database_url, usage_interval=3600.0)
    try:
        await first.admin.SetLabelLimit(
            limit_req("userCreator=*,engineType=*", load(64 * GiB, 64000))
        )
        stop = asyncio.Event()

        async def cycles(rm: Any, labels: str) -> None:
            for _ in range(40):
                t = (await rm.rm.Apply(apply_req(labels, load(GiB, 100)))).ticket
                await rm.rm.Release(pb.ReleaseRequest(ticket_id=t.ticket_id))

        async def rolling(rm: Any) -> None:
            while not stop.is_set():
                await rm.core.usage.roll_up()
                await asyncio.sleep(0)

        rollers = [asyncio.create_task(rolling(rm)) for rm in (first, second)]
        await asyncio.gather(*(cycles(rm, lb) for rm in (first, second) for lb in (USER, OTHER)))
        stop.set()
        await asyncio.gather(*rollers)
        await first.core.usage.roll_up()

        async def history(conn: Any) -> list[tuple[Any, ...]]:
            cur = await conn.execute(
                "SELECT xid, user_name, labels, charged_labels, requested, used, created_at,"
                " reported_at, ended_at, NULL, NULL FROM ticket_history"
            )
            return list(await cur.fetchall())

        rows = await first.core.db.run(history)
        assert len(rows) == 160
        expected = usage_store._ledger_of("tickets", rows)
        totals: dict[str, Amounts] = {}
        for key, amounts in expected.items():
            if key.label == "":
                totals[key.user] = totals.get(key.user, Amounts()) + amounts
        got = await report(first)
        assert {u: g.granted for u, g in got.items()} == {
            u: dict(a.granted) for u, a in totals.items()
        }
        assert {u: g.amounts["tickets"] for u, g in got.items()} == {"alice": 80, "bob": 80}
    finally:
        await stop_in_process(first)
        await stop_in_process(second)


async def test_a_row_committed_after_a_later_one_is_not_skipped(rm_manual_clock, database_url):
    """A transaction writes history and commits only after a later ticket's row was
    rolled up: a watermark on time or on the ids seen would step over it for good. A
    transaction left open in another database of the cluster holds nothing back."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    rm = rm_manual_clock
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(64 * GiB, 64000)))
    late = await psycopg.AsyncConnection.connect(database_url)
    elsewhere = await psycopg.AsyncConnection.connect(
        make_conninfo(database_url, dbname="postgres")
    )
    try:
        await elsewhere.execute("SELECT pg_current_xact_id()")  # an open transaction there
        await late.execute(
            "INSERT INTO ticket_history (ticket_id, final_state, reason, user_name, labels,"
            " charged_labels, requested, created_at, ended_at) VALUES ('late', 'RELEASED',"
            " 'released', 'carol', '[]', '{}', %s, %s, %s)",
            (
                psycopg.types.json.Jsonb({"kind": "memory", "memory_bytes": GiB}),
                START,
                START + timedelta(seconds=10),
            ),
        )
        t = (await rm.rm.Apply(apply_req(OTHER, load(GiB, 100)))).ticket
        rm.clock.advance(90)
        await rm.rm.Release(pb.ReleaseRequest(ticket_id=t.ticket_id))
        assert await rm.core.usage.roll_up() == 0  # bob's row waits behind the open one
        await late.commit()
        assert await rm.core.usage.roll_up() == 2
        by_user = await report(rm)
        assert by_user["carol"].granted == {"memory_bytes": GiB * 10 * US}
        assert by_user["bob"].granted["memory_bytes"] == GiB * 90 * US
        assert await rm.core.usage.roll_up() == 0
    finally:
        await late.close()
        await elsewhere.close()


async def test_an_engineconn_and_demands_give_exact_figures(rm_manual_clock):
    """An EngineConn's ticket held 3 min, its agent's memory samples (1 GiB, then 2 GiB a
    minute later) and final CPU time, the EngineConn's life and end, a demand planned
    then cancelled: each in the ledger exactly, on the manual clock."""
    from labelrm.v1 import demand_pb2, demand_pb2_grpc

    from rm_server.domain.engineconn import EcState, EngineConn, MeasuredUsage
    from rm_server.domain.idempotency import Idempotency
    from rm_server.domain.labels import Label
    from rm_server.domain.resources import Resource
    from rm_server.store import engineconns as ec_store

    rm = rm_manual_clock
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(64 * GiB, 64000)))
    t0 = rm.clock.now()
    ticket = (await rm.rm.Apply(apply_req(USER, load(4 * GiB, 2000)))).ticket
    ec = EngineConn(
        ec_id="ec-1", state=EcState.IDLE, user="alice",
        labels=(Label("userCreator", "alice-IDE"), Label("engineType", "spark-3.2.1")),
        params={}, engine="shell", resource=Resource.load(4 * GiB, 2000), created_at=t0,
        updated_at=t0, ecm_instance="agent1", ticket_id=ticket.ticket_id,
    )  # fmt: skip
    db = rm.core.db
    await db.run(lambda c: ec_store.claim_ec(c, ec, Idempotency.of("CreateEngineConn", "r1", b"")))
    await db.run(
        lambda c: ec_store.update_ec(c, "ec-1", t0, state=EcState.IDLE, ecm_instance="agent1")
    )
    for seconds, memory in ((60, GiB), (120, 2 * GiB)):
        at = t0 + timedelta(seconds=seconds)
        sample = [("agent1", "ec-1", MeasuredUsage(memory_bytes=memory))]
        await db.run(lambda c, s=sample, a=at: ec_store.record_usage(c, s, a))
    rm.clock.advance(180)
    end = rm.clock.now()
    final = MeasuredUsage(memory_bytes=2 * GiB, memory_peak_bytes=2 * GiB, cpu_time_micros=30 * US)

    async def ended(conn: Any) -> None:
        from rm_server.store import tickets as ticket_store

        await ticket_store.release(conn, ticket.ticket_id, end, "EngineConn succeeded")
        await ec_store.update_ec(conn, "ec-1", end, state=EcState.SUCCEEDED, ended_at=end)
        await ec_store.keep_measured(conn, ticket.ticket_id, "ec-1", final)

    await db.run(ended)
    demands = demand_pb2_grpc.DemandServiceStub(rm.channel)
    await demands.SubmitDemand(
        demand_pb2.SubmitDemandRequest(
            demand_id="d1", labels=lbl_of(USER), resource=load(GiB, 100),
            time_conditions_text="{Start: [+1h, +2h]}",
        )
    )  # fmt: skip
    await demands.CancelDemand(demand_pb2.CancelDemandRequest(demand_id="d1"))
    await rm.core.usage.roll_up()
    alice = (await report(rm))["alice"]
    assert alice.granted == {"memory_bytes": 4 * GiB * 180 * US, "cpu_millis": 2000 * 180 * US}
    a = alice.amounts
    # memory: 1 GiB held from the first sample to the second (60 s); CPU: the cgroup's total
    assert (a["measured_memory"], a["measured_cpu"]) == (GiB * 60 * US, 30 * US)
    assert a["measured_granted_memory"] == 4 * GiB * 180 * US
    assert (a["engine_conns"], a["engine_conns_failed"], a["engine_conn_time"]) == (1, 0, 180 * US)
    assert (a["demands_planned"], a["demands_allocated"], a["demands_failed"]) == (1, 0, 1)
    # the service's efficiency: 60 GiB-s of 720 GiB-s granted, 30 CPU-s of 360 core-s
    from labelrm.v1 import usage_pb2, usage_pb2_grpc

    row = (await usage_pb2_grpc.UsageServiceStub(rm.channel).GetUsage(
        usage_pb2.GetUsageRequest(user="alice")
    )).rows[0]  # fmt: skip
    assert row.memory_efficiency == 60 / 720 and row.cpu_efficiency == 30 / 360


def lbl_of(text: str) -> Any:
    from tests.support.messages import lbl

    return lbl(text)


async def test_prometheus_counts_resource_seconds_by_user_and_engine_type(database_url):
    """What a roll-up adds goes to the counters once; past the label cap, the rest
    counts under _other."""
    from rm_server.clock import ManualClock
    from tests.support.rm import start_in_process, stop_in_process

    rm = await start_in_process(
        database_url, clock=ManualClock(), sweep_interval=3600.0, metrics_label_cap=1
    )
    try:
        await run_known_tickets(rm)
        await rm.core.usage.roll_up()
        await rm.core.usage.roll_up()  # nothing new: counted once
        metrics = rm.server.metrics
        assert metrics is not None
        text = (await metrics.exposition()).decode()
        samples = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("labelrm_usage_granted_resource_seconds_total{")
        }
        alice = (2 * GiB * 30 + GiB * 3600 + GiB * 10) * 1.0
        assert samples == {
            'labelrm_usage_granted_resource_seconds_total{dimension="memory_bytes",'
            'engine_type="spark-3.2.1",user="alice"}': alice,
            'labelrm_usage_granted_resource_seconds_total{dimension="cpu_millis",'
            'engine_type="spark-3.2.1",user="alice"}': 500 * 30 + 250 * 3600 + 1000 * 10.0,
            'labelrm_usage_granted_resource_seconds_total{dimension="memory_bytes",'
            'engine_type="_other",user="_other"}': GiB * 90.0,
            'labelrm_usage_granted_resource_seconds_total{dimension="cpu_millis",'
            'engine_type="_other",user="_other"}': 100 * 90.0,
        }
    finally:
        await stop_in_process(rm)
