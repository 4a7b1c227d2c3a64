"""UsageService over real gRPC: the ledger's figures in seconds, the period and paging,
bad input, and on a secured deployment, a user reads their own usage only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import usage_pb2, usage_pb2_grpc

from tests.integration.console_fixtures import (
    browser,  # noqa: F401 - a fixture
    dev_console,
    errors_of,
    goto,
    new_page,
)
from tests.integration.console_fixtures import get as console_get
from tests.integration.security_fixtures import make_pki, start_secure, stop_secure
from tests.integration.test_usage import run_known_tickets
from tests.support.messages import GiB, apply_req, limit_req, load, load_instance, register
from tests.support.refusals import bad_field

SINCE = Timestamp(seconds=int(datetime(2026, 1, 1, tzinfo=UTC).timestamp()))
UNTIL = Timestamp(seconds=int(datetime(2026, 1, 2, tzinfo=UTC).timestamp()))


def usage_stub(rm: Any) -> usage_pb2_grpc.UsageServiceStub:
    return usage_pb2_grpc.UsageServiceStub(rm.channel)


async def test_get_usage_in_seconds_with_efficiency_absent_when_nothing_measured(rm_manual_clock):
    rm = rm_manual_clock
    await run_known_tickets(rm)
    await rm.core.usage.roll_up()
    stub = usage_stub(rm)
    got = await stub.GetUsage(usage_pb2.GetUsageRequest(since=SINCE, until=UNTIL))
    rows = {r.key: r for r in got.rows}
    assert sorted(rows) == ["alice", "bob"]
    bob = rows["bob"]
    assert dict(bob.granted) == {"memory_bytes": GiB * 90.0, "cpu_millis": 100 * 90.0}
    assert bob.tickets == 1
    assert not bob.HasField("cpu_efficiency") and not bob.HasField("memory_efficiency")
    # by hour, one page at a time
    hours = usage_pb2.GetUsageRequest(
        since=SINCE, until=UNTIL, group_by=usage_pb2.USAGE_GROUPING_HOUR, page_size=1
    )
    first = await stub.GetUsage(hours)
    assert [r.key for r in first.rows] == ["2026-01-01T00:00:00Z"] and first.next_page_token
    hours.page_token = first.next_page_token
    second = await stub.GetUsage(hours)
    assert [r.key for r in second.rows] == ["2026-01-01T01:00:00Z"]
    assert second.rows[0].granted["memory_bytes"] == GiB * 1830.0
    assert not second.next_page_token
    by_engine = await stub.GetUsage(
        usage_pb2.GetUsageRequest(
            since=SINCE, until=UNTIL, group_by=usage_pb2.USAGE_GROUPING_ENGINE_TYPE
        )
    )
    assert [r.key for r in by_engine.rows] == ["hive-2.3.3", "spark-3.2.1"]


async def test_bad_periods_are_refused_naming_the_field(rm_manual_clock):
    stub = usage_stub(rm_manual_clock)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetUsage(usage_pb2.GetUsageRequest(since=UNTIL, until=SINCE))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(err.value) == "since"
    long_ago = Timestamp(seconds=SINCE.seconds - 400 * 86400)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetUsage(usage_pb2.GetUsageRequest(since=long_ago, until=UNTIL))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and bad_field(err.value) == "since"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetUsage(usage_pb2.GetUsageRequest(group_by=99))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(err.value) == "group_by"


async def test_a_user_reads_only_their_own_usage(database_url, tmp_path):
    """Bob asks for Alice's usage by name, by label and by engine type: refused without
    her name, or only his own rows; the operator sees both."""
    srm = await start_secure(database_url, make_pki(tmp_path / "pki"), console_listen="127.0.0.1:0")
    try:
        admin = srm.stubs(srm.channel("root"))
        await admin.rm.RegisterEcm(register("agent1", load_instance(8 * GiB, 8000, 8)))
        await admin.admin.SetLabelLimit(
            limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000))
        )
        for user in ("alice", "bob"):
            stubs = srm.stubs(srm.channel(user))
            labels = f"userCreator={user}-IDE,engineType=spark-3.2.1,emInstance=agent1"
            t = (await stubs.rm.Apply(apply_req(labels, load(GiB, 100)))).ticket
            await stubs.rm.Release(pb.ReleaseRequest(ticket_id=t.ticket_id))
        await srm.server.core.usage.roll_up()
        bob = usage_pb2_grpc.UsageServiceStub(srm.channel("bob"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bob.GetUsage(usage_pb2.GetUsageRequest(user="alice"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "alice" not in err.value.details()
        for grouping in usage_pb2.UsageGrouping.values():
            own = await bob.GetUsage(usage_pb2.GetUsageRequest(group_by=grouping))
            keys = [r.key for r in own.rows]
            assert len(keys) == (2 if grouping == usage_pb2.USAGE_GROUPING_LABEL else 1), keys
            assert not any("alice" in k for k in keys)
        operator = usage_pb2_grpc.UsageServiceStub(srm.channel("root"))
        everyone = await operator.GetUsage(usage_pb2.GetUsageRequest())
        assert [r.key for r in everyone.rows] == ["alice", "bob"]
        hers = await operator.GetUsage(usage_pb2.GetUsageRequest(user="alice"))
        assert [r.key for r in hers.rows] == ["alice"]
        # The console's Usage page: Bob's chart and table hold his own usage only.
        bob_token, root_token = srm.pki.tokens["bob"], srm.pki.tokens["root"]
        status, page = await console_get(srm, "/api/usage?days=1", bob_token)
        assert status == 200 and page["group_by"] == "engine_type"
        assert [g["key"] for g in page["groups"]] == ["spark-3.2.1"]
        assert page["groups"][0]["tickets"] == 1 and sum(h["tickets"] for h in page["hours"]) == 1
        status, page = await console_get(srm, "/api/usage?days=1", root_token)
        assert [g["key"] for g in page["groups"]] == ["alice", "bob"]
        status, page = await console_get(srm, "/api/usage?days=999", root_token)
        assert status == 400 and "days" in page["error"]
    finally:
        await stop_secure(srm)


async def test_rmctl_usage_table_csv_and_json(rm_manual_clock, capsys):
    from tests.support.sdk import ctl

    rm = rm_manual_clock
    await run_known_tickets(rm)
    await rm.core.usage.roll_up()
    period = ("--since", "2026-01-01", "--until", "2026-01-02")
    capsys.readouterr()
    assert await ctl(rm, "usage", *period) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["USER", "TICKETS", "MEM_GRANTED_GIB_H"]
    bob = table[2].split()
    # 1 GiB for 90 s = 0.025 GiB-hours; 100m for 90 s = 0.0025 core-hours; nothing measured
    assert bob[:4] == ["bob", "1", "0.03", "0.00"] and bob[6:8] == ["-", "-"]
    assert await ctl(rm, "usage", *period, "--by", "engine-type", "-o", "csv") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("engine_type,tickets,granted_memory_byte_seconds,")
    hive = lines[1].split(",")
    assert hive[:4] == ["hive-2.3.3", "1", str(GiB * 90.0), "9000.0"]
    assert await ctl(rm, "usage", *period, "-o", "json") == 0
    assert '"key": "alice"' in capsys.readouterr().out
    assert await ctl(rm, "usage", "--since", "last week") == 2  # argparse: a usage error


async def test_the_console_charts_usage_by_hour(database_url, browser):  # noqa: F811
    """The Usage page: a bar per hour with granted memory, a row per user."""
    from rm_server.clock import ManualClock

    async with dev_console(database_url, clock=ManualClock(), sweep_interval=3600.0) as rm:
        await run_known_tickets(rm)
        await rm.core.usage.roll_up()
        page = await new_page(browser, rm)
        await goto(page, rm, "#/usage")
        await page.wait_for_selector(
            "[data-testid=usage-table] tbody tr td:has-text('bob')", timeout=90_000
        )
        bars = await page.query_selector_all("[data-testid=usage-bar]")
        hours = [await b.get_attribute("data-hour") for b in bars]
        assert hours == ["2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"]
        heights = [float(await b.get_attribute("height") or 0) for b in bars]
        assert heights[0] > heights[1] > 0  # 1.2 GiB-h before 01:00, 0.5 after
        rows = await page.query_selector_all("[data-testid=usage-table] tbody tr td:first-child")
        assert [await r.text_content() for r in rows] == ["alice", "bob"]
        assert errors_of(page) == []
