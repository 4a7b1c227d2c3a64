"""The Prometheus endpoint, scraped over HTTP after known operations and parsed with
prometheus_client's own parser: RPC counts and latencies, Apply outcomes, waiting
Applies, per-label gauges, lock-expiry reclaims and the cap on label records."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from rm_server.clock import ManualClock
from tests.support.messages import GiB, apply_req, limit_req, load, load_instance, present, register
from tests.support.rm import beat_on_stream, start_in_process, stop_in_process
from tests.support.waiting import wait_until

APPLY = "labelrm.v1.ResourceManagerService/Apply"
ECM = "emInstance=host1:9000"
LABELS = f"userCreator=alice-IDE,engineType=spark-3.2.1,{ECM}"


@pytest.fixture
async def rm_metrics(database_url):
    rm = await start_in_process(
        database_url,
        clock=ManualClock(),
        metrics_listen="127.0.0.1:0",
        lock_timeout=60.0,
        sweep_interval=3600.0,
    )
    metrics = present(rm.server.metrics)
    present(metrics.labels).cache_seconds = 0  # every scrape reads the database
    try:
        yield rm
    finally:
        await stop_in_process(rm)


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


async def scrape(rm) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, frozenset of label items): value} from a real HTTP scrape."""
    url = f"http://127.0.0.1:{rm.server.metrics_port}/metrics"
    status, ctype, text = await asyncio.to_thread(_get, url)
    assert status == 200
    assert ctype.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name: str, **labels) -> float:
    return float(samples.get((name, frozenset(labels.items())), 0.0))


async def test_rpc_counts_and_apply_outcomes(rm_metrics):
    rm = rm_metrics
    before = await scrape(rm)
    assert value(before, "labelrm_apply_total", outcome="granted") == 0
    await rm.rm.RegisterEcm(register("host1:9000", load_instance(8 * GiB, 8000, 4)))

    granted = await rm.rm.Apply(apply_req(LABELS, load_instance(GiB, 1000, 1)))
    with pytest.raises(grpc.aio.AioRpcError) as exc:  # more than the ECM has
        await rm.rm.Apply(apply_req(LABELS, load_instance(16 * GiB, 1000, 1)))
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.aio.AioRpcError) as exc:  # no labels at all
        await rm.rm.Apply(pb.ApplyRequest(resource=load(GiB, 1)))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as exc:  # waits, then times out
        await rm.rm.Apply(apply_req(LABELS, load_instance(16 * GiB, 1000, 1), wait=0.2))
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    after = await scrape(rm)
    assert value(after, "labelrm_apply_total", outcome="granted") == 1
    assert value(after, "labelrm_apply_total", outcome="insufficient_resource") == 1
    assert value(after, "labelrm_apply_total", outcome="invalid_argument") == 1
    assert value(after, "labelrm_apply_total", outcome="wait_timeout") == 1
    assert value(after, "labelrm_rpc_total", method=APPLY, code="OK") == 1
    assert value(after, "labelrm_rpc_total", method=APPLY, code="RESOURCE_EXHAUSTED") == 1
    assert value(after, "labelrm_rpc_total", method=APPLY, code="INVALID_ARGUMENT") == 1
    assert value(after, "labelrm_rpc_total", method=APPLY, code="DEADLINE_EXCEEDED") == 1
    register_method = "labelrm.v1.ResourceManagerService/RegisterEcm"
    assert value(after, "labelrm_rpc_total", method=register_method, code="OK") == 1
    # The histogram counts the same calls, per method and code (how long they took is
    # the benchmarks' business): one observation, in the +Inf bucket and in the sum.
    timeout = {"method": APPLY, "code": "DEADLINE_EXCEEDED"}
    assert value(after, "labelrm_rpc_duration_seconds_count", **timeout) == 1
    assert value(after, "labelrm_rpc_duration_seconds_bucket", **timeout, le="+Inf") == 1
    assert value(after, "labelrm_rpc_duration_seconds_sum", **timeout) > 0
    assert value(after, "labelrm_apply_waiting") == 0

    # Per-label gauges: the ECM's record, in its dimensions' own units.
    ecm = {"label": ECM, "source": "ecm"}
    assert value(after, "labelrm_label_locked", **ecm, dimension="memory_bytes") == GiB
    assert value(after, "labelrm_label_used", **ecm, dimension="memory_bytes") == 0
    assert value(after, "labelrm_label_max", **ecm, dimension="cpu_millis") == 8000
    assert value(after, "labelrm_label_left", **ecm, dimension="memory_bytes") == 7 * GiB
    assert value(after, "labelrm_label_left", **ecm, dimension="instances") == 3
    assert value(after, "labelrm_label_live_tickets", **ecm) == 1
    assert value(after, "labelrm_label_records", source="ecm") == 1
    assert value(after, "labelrm_label_scrape_success") == 1
    assert value(after, "labelrm_label_records_truncated") == 0

    # ReportUsed moves the charge from locked to used.
    await rm.rm.ReportUsed(
        pb.ReportUsedRequest(
            ticket_id=granted.ticket.ticket_id, used_resource=load_instance(GiB // 2, 500, 1)
        )
    )
    used = await scrape(rm)
    assert value(used, "labelrm_label_used", **ecm, dimension="memory_bytes") == GiB // 2
    assert value(used, "labelrm_label_locked", **ecm, dimension="memory_bytes") == 0
    assert value(used, "process_resident_memory_bytes") > 0  # the standard collectors


async def test_waiting_applies_gauge(rm_metrics):
    rm = rm_metrics
    await rm.rm.RegisterEcm(register("host1:9000", load_instance(2 * GiB, 8000, 4)))
    first = await rm.rm.Apply(apply_req(LABELS, load_instance(2 * GiB, 1000, 1)))
    waiter = asyncio.ensure_future(
        rm.rm.Apply(apply_req(LABELS, load_instance(GiB, 1000, 1), wait=20))
    )

    async def waiting() -> float:
        return value(await scrape(rm), "labelrm_apply_waiting")

    assert await wait_until(waiting, timeout=10) == 1
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=first.ticket.ticket_id))
    second = await asyncio.wait_for(waiter, timeout=20)
    assert second.ticket.state == pb.TICKET_STATE_LOCKED
    samples = await scrape(rm)
    assert value(samples, "labelrm_apply_waiting") == 0
    assert value(samples, "labelrm_apply_total", outcome="granted") == 2


async def test_lock_expiry_reclaims_are_counted(rm_metrics):
    rm = rm_metrics
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    combined = "userCreator=alice-IDE,engineType=spark-3.2.1"
    for _ in range(2):
        await rm.rm.Apply(apply_req(combined, load(GiB, 100)))
    assert value(await scrape(rm), "labelrm_lock_expiry_reclaims_total") == 0
    rm.clock.advance(61)
    assert await rm.core.sweeps.sweep() == 2
    samples = await scrape(rm)
    assert value(samples, "labelrm_lock_expiry_reclaims_total") == 2
    limit = {"label": combined, "source": "limit"}
    assert value(samples, "labelrm_label_locked", **limit, dimension="memory_bytes") == 0
    assert value(samples, "labelrm_label_left", **limit, dimension="memory_bytes") == 4 * GiB


async def test_label_records_are_capped(database_url):
    rm = await start_in_process(database_url, metrics_listen="127.0.0.1:0", metrics_label_cap=2)
    try:
        for i in range(3):
            await rm.rm.RegisterEcm(register(f"host{i}:9000", load_instance(GiB, 1000, 1)))
        samples = await scrape(rm)
        assert value(samples, "labelrm_label_records", source="ecm") == 2
        assert value(samples, "labelrm_label_records_truncated") == 1
        exported = {
            dict(labels)["label"] for (name, labels) in samples if name == "labelrm_label_max"
        }
        assert exported == {"emInstance=host0:9000", "emInstance=host1:9000"}
    finally:
        await stop_in_process(rm)


async def test_endpoint_answers_only_metrics(rm_metrics):
    base = f"http://127.0.0.1:{rm_metrics.server.metrics_port}"
    status, _, body = await asyncio.to_thread(_get, base + "/nope")
    assert status == 404
    status, _, body = await asyncio.to_thread(_get, base + "/")
    assert status == 200 and "/metrics" in body


async def test_each_beat_on_a_heartbeat_stream_is_timed(rm_metrics):
    rm = rm_metrics
    method = "labelrm.v1.ResourceManagerService/HeartbeatStream"
    await rm.rm.RegisterEcm(register("host1:9000", load_instance(8 * GiB, 8000, 4)))
    stream = rm.rm.HeartbeatStream(timeout=30)
    for seq in (1, 2, 3):
        beat = pb.HeartbeatRequest(agent_id="host1:9000", sequence=seq)
        answer = await beat_on_stream(stream, beat)
        assert answer.sequence == seq
    during = await scrape(rm)
    # Three beats answered, each timed; the stream itself is one RPC, not ended yet.
    assert value(during, "labelrm_stream_message_duration_seconds_count", method=method) == 3
    assert value(during, "labelrm_stream_message_duration_seconds_sum", method=method) > 0
    assert value(during, "labelrm_rpc_total", method=method, code="OK") == 0
    await stream.done_writing()
    assert await stream.read() is grpc.aio.EOF

    async def ended() -> float:
        return value(await scrape(rm), "labelrm_rpc_total", method=method, code="OK")

    assert await wait_until(ended, timeout=10) == 1
