"""External resources: YARN queues under a cluster label, against the stand-in YARN RM
(tests/yarn_standin.py, built from Hadoop's ResourceManager REST documentation).

Real gRPC to an in-process RM on a real PostgreSQL; real HTTP from the RM to the stand-in."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from labelrm.v1 import admin_pb2, external_pb2, resource_manager_pb2, resource_pb2

from tests.support.messages import GiB, apply_req, limit_req
from tests.support.refusals import refused as refusal
from tests.support.rm import assert_consistent, label_state
from tests.support.waiting import wait_until
from tests.yarn_standin import HAPair, StandinRM, capacity_cluster, fair_cluster

USER = "userCreator=alice-IDE,engineType=spark-3.2.1"
A1 = "cluster=prod,yarnQueue=root.a.a1"


def dy(
    queue: str, yarn_gib: int, yarn_cores: int = 1, driver_gib: int = 1
) -> resource_pb2.Resource:
    """A Spark-style driver_and_yarn request: a driver on a server, executors in `queue`."""
    return resource_pb2.Resource(
        driver_and_yarn=resource_pb2.DriverAndYarnResource(
            driver=resource_pb2.LoadInstanceResource(
                memory_bytes=driver_gib * GiB, cpu_millis=1000, instances=1
            ),
            yarn=resource_pb2.YarnResource(
                queue_name=queue,
                queue_memory_bytes=yarn_gib * GiB,
                queue_cpu_millis=yarn_cores * 1000,
                queue_instances=1,
            ),
        )
    )


def provider(
    addresses, cluster: str = "prod", ttl: float = 30.0, **kw
) -> admin_pb2.PutExternalProviderRequest:
    return admin_pb2.PutExternalProviderRequest(
        provider=external_pb2.ExternalProvider(
            name=f"{cluster}-yarn",
            type="yarn",
            cluster=cluster,
            addresses=list(addresses),
            cache_ttl_seconds=ttl,
            timeout_seconds=kw.pop("timeout", 2.0),
            **kw,
        )
    )


def details(err: grpc.aio.AioRpcError) -> tuple[str, list[Any]]:
    status = rpc_status.from_call(err)
    assert isinstance(status, status_pb2.Status)
    reason, shortfalls = "", []
    for d in status.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            reason = info.reason
        if d.Is(resource_pb2.Shortfalls.DESCRIPTOR):
            s = resource_pb2.Shortfalls()
            d.Unpack(s)
            shortfalls = list(s.shortfalls)
    return reason, shortfalls


@pytest.fixture
def capacity():
    state = capacity_cluster()  # 100 GiB, 100 vCores; root.a.a1 may grow to 60%
    pair = HAPair(state)
    yield state, pair
    pair.stop()


async def apply(rm, queue: str, yarn_gib: int, labels: str = USER + ",cluster=prod", **kw):
    return await rm.rm.Apply(apply_req(labels, dy(queue, yarn_gib, **kw)))


async def queue_short_of_memory(call: Any) -> None:
    """`call` (an Apply on queue root.a.a1) is refused for the queue's memory alone."""
    err = await refusal(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "INSUFFICIENT_RESOURCE")
    _, shortfalls = details(err)
    assert [(s.label, s.dimension) for s in shortfalls] == [(A1, "yarn.memory_bytes")]


async def test_provider_test_lists_nested_queues_and_list_hides_the_password(rm, capacity):
    state, pair = capacity
    req = provider(pair.addresses)
    req.provider.auth, req.provider.username, req.provider.password = "basic", "yarn", "s3cret"
    pair.rm1.basic_auth = pair.rm2.basic_auth = ("yarn", "s3cret")
    put = await rm.admin.PutExternalProvider(req)
    assert put.provider.password == "" and put.provider.has_password
    listed = await rm.admin.ListExternalProviders(admin_pb2.ListExternalProvidersRequest())
    assert [p.name for p in listed.providers] == ["prod-yarn"]
    assert listed.providers[0].password == "" and "s3cret" not in str(listed)
    state.start_app("root.a.a1", 10 * 1024, 10)

    seen = await rm.admin.TestExternalProvider(
        admin_pb2.TestExternalProviderRequest(name="prod-yarn")
    )

    assert seen.scheduler == "capacity" and seen.active_address == pair.rm1.address
    queues = {q.queue: q for q in seen.queues}
    assert set(queues) == {"root.a", "root.a.a1", "root.a.a2", "root.b"}
    a1 = queues["root.a.a1"]
    assert a1.leaf and not queues["root.a"].leaf
    assert a1.yarn_max.yarn.queue_memory_bytes == 60 * GiB  # absoluteMaxCapacity 60% of 100 GiB
    assert a1.yarn_used.yarn.queue_memory_bytes == 10 * GiB
    assert a1.left.yarn.queue_memory_bytes == 50 * GiB and a1.apps_running == 1
    assert queues["root.a"].yarn_used.yarn.queue_memory_bytes == 10 * GiB  # parents sum


async def test_capacity_nested_queue_admits_against_live_headroom(rm, capacity):
    state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=0))
    app = state.start_app("root.a.a1", 50 * 1024, 10)  # YARN: 50 of 60 GiB used

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await apply(rm, "a1", 20)  # the leaf's own name resolves to root.a.a1

    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _reason, shortfalls = details(refused.value)
    assert [(s.label, s.dimension, s.requested, s.available) for s in shortfalls] == [
        (A1, "yarn.memory_bytes", 20 * GiB, 10 * GiB)
    ]
    assert (
        "YARN max 64424509440 - YARN used 53687091200 - labelrm in flight 0"
        in refused.value.details()
    )

    granted = await apply(rm, "root.a.a1", 8)
    assert granted.ticket.requested_resource.driver_and_yarn.yarn.queue_name == "root.a.a1"
    with pytest.raises(grpc.aio.AioRpcError) as again:  # 2 GiB left: 8 are in flight
        await apply(rm, "root.a.a1", 4)
    _, shortfalls = details(again.value)
    assert [(s.requested, s.available) for s in shortfalls] == [(4 * GiB, 2 * GiB)]
    assert "labelrm in flight 8589934592" in again.value.details()

    state.finish_app(app)  # YARN frees 50 GiB: admitted on the next fetch
    assert (await apply(rm, "root.a.a1", 20)).ticket.ticket_id
    record = await label_state(rm, A1)
    assert record.source == "external" and record.live_tickets == 2
    await assert_consistent(rm)


async def test_fair_scheduler_nested_queue(rm):
    state = fair_cluster()  # sample_sub_queue: max 16 GiB, 16 vCores
    server = StandinRM(state)
    try:
        await rm.admin.PutExternalProvider(provider([server.address], ttl=0))
        state.start_app("root.sample_queue.sample_sub_queue", 12 * 1024, 4)
        ok = await apply(rm, "sample_queue.sample_sub_queue", 4, yarn_cores=12)
        assert ok.ticket.requested_resource.driver_and_yarn.yarn.queue_name == (
            "root.sample_queue.sample_sub_queue"
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await apply(rm, "root.sample_queue.sample_sub_queue", 1)
        _, shortfalls = details(refused.value)
        assert {s.dimension for s in shortfalls} == {"yarn.memory_bytes", "yarn.cpu_millis"}
        seen = await rm.admin.TestExternalProvider(
            admin_pb2.TestExternalProviderRequest(name="prod-yarn")
        )
        sub = next(q for q in seen.queues if q.queue == "root.sample_queue.sample_sub_queue")
        assert (
            sub.scheduler == "fair" and sub.apps_running == 1
        )  # numActiveApps, not capacity's names
        assert sub.in_flight.yarn.queue_memory_bytes == 4 * GiB
    finally:
        server.stop()


async def test_concurrent_applies_never_share_the_last_headroom(rm, capacity):
    """Linkis checks YARN's figures and locks nothing: two applies both pass. Here the
    queue record is locked in the Apply's transaction, in flight counted: exactly N fit."""
    state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=300))
    state.start_app("root.a.a1", 30 * 1024, 10)  # 30 GiB left, YARN's figure frozen in cache

    results = await asyncio.gather(
        *(apply(rm, "root.a.a1", 4) for _ in range(24)), return_exceptions=True
    )

    granted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(granted) == 7 and len(refused) == 17  # 7 x 4 GiB <= 30 GiB < 8 x 4 GiB
    assert all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused)
    record = await label_state(rm, A1)
    assert record.live_tickets == 7
    # The queue's record holds the yarn part only (the driver part is the ECM's).
    assert record.locked_resource.yarn.queue_memory_bytes == 28 * GiB
    await assert_consistent(rm)


async def test_report_used_moves_a_grant_out_of_flight_and_release_returns_it(rm, capacity):
    state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=0))
    ticket = (await apply(rm, "root.a.a1", 50)).ticket
    await queue_short_of_memory(apply(rm, "root.a.a1", 20))  # 50 in flight of 60
    # The EngineConn's application is now running on YARN: it reports used, and YARN shows it.
    await rm.rm.ReportUsed(resource_manager_pb2.ReportUsedRequest(ticket_id=ticket.ticket_id))
    app = state.start_app("root.a.a1", 50 * 1024, 1)
    # Now YARN's used holds it (not counted twice): still short, by the same memory.
    await queue_short_of_memory(apply(rm, "root.a.a1", 20))
    assert (await apply(rm, "root.a.a1", 10)).ticket.ticket_id
    state.finish_app(app)
    await rm.rm.Release(resource_manager_pb2.ReleaseRequest(ticket_id=ticket.ticket_id))
    assert (await apply(rm, "root.a.a1", 40)).ticket.ticket_id
    await assert_consistent(rm)


async def test_ha_failover_finds_the_new_active_rm(rm, capacity):
    _state, pair = capacity
    # The standby first in the list: discovery asks /info and skips it.
    await rm.admin.PutExternalProvider(provider([pair.rm2.address, pair.rm1.address], ttl=0))
    assert (await apply(rm, "root.a.a1", 1)).ticket.ticket_id
    assert pair.rm2.count("/ws/v1/cluster/scheduler") == 0  # never asked the standby for data
    pair.failover()  # rm2 active now; rm1 answers 307 "This is standby RM"
    assert (await apply(rm, "root.a.a1", 1)).ticket.ticket_id
    assert pair.rm2.count("/ws/v1/cluster/scheduler") >= 1
    pair.rm2.stop()  # the new active dies, rm1 stays standby: nobody to ask
    pair.rm1.active = True  # ... until rm1 takes over again
    assert (await apply(rm, "root.a.a1", 1)).ticket.ticket_id


async def test_rm_down_is_unavailable_and_charges_nothing(rm, capacity, caplog):
    _state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=0))
    assert (await apply(rm, "root.a.a1", 1)).ticket.ticket_id
    before = await label_state(rm, A1)
    pair.stop()
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    with pytest.raises(grpc.aio.AioRpcError) as down:
        await apply(rm, "root.a.a1", 1)
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    assert details(down.value)[0] == "EXTERNAL_UNAVAILABLE"
    assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]
    after = await label_state(rm, A1)
    assert after.live_tickets == before.live_tickets == 1
    tickets = await rm.rm.ListTickets(resource_manager_pb2.ListTicketsRequest(page_size=100))
    assert len(tickets.tickets) == 1
    await assert_consistent(rm)


async def test_malformed_500_slow_and_unsupported_answers_are_clear_errors(rm, capacity):
    state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=0, timeout=0.5))
    cases = [
        ("malformed", grpc.StatusCode.UNAVAILABLE, "EXTERNAL_MALFORMED"),
        ("500", grpc.StatusCode.UNAVAILABLE, "EXTERNAL_UNAVAILABLE"),
    ]
    for fail, code, reason in cases:
        pair.rm1.fail = fail
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await apply(rm, "root.a.a1", 1)
        assert (err.value.code(), details(err.value)[0]) == (code, reason), fail
    pair.rm1.fail = None
    pair.rm1.delay = 1.0  # past the provider's 0.5 s timeout
    with pytest.raises(grpc.aio.AioRpcError) as slow:
        await apply(rm, "root.a.a1", 1)
    assert slow.value.code() == grpc.StatusCode.UNAVAILABLE
    pair.rm1.delay = 0.0
    state.scheduler = "fifo"
    with pytest.raises(grpc.aio.AioRpcError) as fifo:
        await apply(rm, "root.a.a1", 1)
    assert fifo.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "fifoScheduler" in fifo.value.details()
    tickets = await rm.rm.ListTickets(resource_manager_pb2.ListTicketsRequest(page_size=100))
    assert list(tickets.tickets) == []


async def test_unknown_parent_and_unnamed_queues_and_unknown_cluster(rm, capacity):
    _state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses))
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await apply(rm, "root.nope", 1)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert details(unknown.value)[0] == "EXTERNAL_UNKNOWN_QUEUE"
    with pytest.raises(grpc.aio.AioRpcError) as parent:
        await apply(rm, "root.a", 1)
    assert parent.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "parent queue" in parent.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as unnamed:
        await apply(rm, "", 1)
    assert unnamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "queue_name" in unnamed.value.details()
    yarn_only = resource_pb2.Resource(
        yarn=resource_pb2.YarnResource(queue_name="a2", queue_memory_bytes=GiB, queue_instances=1)
    )
    ticket = (await rm.rm.Apply(apply_req(USER + ",cluster=prod", yarn_only))).ticket
    assert ticket.requested_resource.yarn.queue_name == "root.a.a2"  # a bare yarn request too
    with pytest.raises(grpc.aio.AioRpcError) as other:
        await apply(rm, "root.a.a1", 1, labels=USER + ",cluster=test")
    assert other.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cluster=test" in other.value.details()


async def test_cache_ttl_and_singleflight_one_fetch_per_ttl(rm, capacity):
    _state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=300))
    before = pair.rm1.count("/ws/v1/cluster/scheduler")
    results = await asyncio.gather(*(apply(rm, "root.a.a1", 1) for _ in range(20)))
    assert len(results) == 20
    assert pair.rm1.count("/ws/v1/cluster/scheduler") - before == 1
    assert pair.rm1.count("/ws/v1/cluster/metrics") == 1  # capacity: totals fetched with it


async def test_basic_auth_rejected_is_a_clear_precondition(rm, capacity):
    _state, pair = capacity
    pair.rm1.basic_auth = pair.rm2.basic_auth = ("yarn", "right")
    req = provider(pair.addresses)
    req.provider.auth, req.provider.username, req.provider.password = "basic", "yarn", "wrong"
    await rm.admin.PutExternalProvider(req)
    with pytest.raises(grpc.aio.AioRpcError) as rejected:
        await apply(rm, "root.a.a1", 1)
    assert rejected.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert details(rejected.value)[0] == "EXTERNAL_AUTH"
    req.provider.password = "right"
    await rm.admin.PutExternalProvider(req)
    assert (await apply(rm, "root.a.a1", 1)).ticket.ticket_id
    req.provider.password = ""  # a change of TTL only: the stored password stays
    req.provider.cache_ttl_seconds = 0
    stored = await rm.admin.PutExternalProvider(req)
    assert stored.provider.has_password and stored.provider.cache_ttl_seconds == 0
    assert (await apply(rm, "root.a.a1", 1)).ticket.ticket_id


async def test_bad_provider_definitions_are_refused_naming_the_field(rm):
    bad_cluster = provider(["http://a:1"])
    bad_cluster.provider.cluster = "bad value"
    bad = [
        (provider([]), "provider.addresses"),
        (provider(["ftp://x"]), "provider.addresses[0]"),
        (bad_cluster, "provider.cluster"),
    ]
    for req, field in bad:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rm.admin.PutExternalProvider(req)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(field), err.value.details()
    await rm.admin.PutExternalProvider(provider(["http://127.0.0.1:1"]))
    clash = provider(["http://127.0.0.1:2"])
    clash.provider.name = "other"
    with pytest.raises(grpc.aio.AioRpcError) as taken:
        await rm.admin.PutExternalProvider(clash)
    assert taken.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    gone = await rm.admin.DeleteExternalProvider(
        admin_pb2.DeleteExternalProviderRequest(name="prod-yarn")
    )
    assert gone.provider.name == "prod-yarn"
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await rm.admin.DeleteExternalProvider(
            admin_pb2.DeleteExternalProviderRequest(name="prod-yarn")
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_rmctl_provider_add_list_test_rm(rm, capacity, capsys, monkeypatch):
    import rmctl

    state, pair = capacity
    pair.rm1.basic_auth = pair.rm2.basic_auth = ("yarn", "pw")
    monkeypatch.setenv("LABELRM_PROVIDER_PASSWORD", "pw")

    def ctl(*argv: str):
        return asyncio.to_thread(rmctl.main, ["--rm", rm.target, *argv])

    add = ["provider", "add", "prod-yarn", "--cluster", "prod", "--auth", "basic", "--user", "yarn"]
    assert await ctl(*add, "--rm-web-address", ";".join(pair.addresses)) == 0
    assert "cluster=prod" in capsys.readouterr().out
    assert await ctl("provider", "list") == 0
    listed = capsys.readouterr().out
    assert "prod-yarn" in listed and pair.rm2.address in listed and "pw" not in listed
    state.start_app("root.a.a1", 10 * 1024, 10)
    await apply(rm, "root.a.a1", 5)

    assert await ctl("provider", "test", "prod-yarn") == 0

    out = capsys.readouterr().out
    assert f"active RM {pair.rm1.address}, capacity scheduler, 4 queues" in out
    a1 = next(line for line in out.splitlines() if line.startswith("root.a.a1 "))
    # yarn max, yarn used, in flight, left: 60 - 10 - 5 = 45 GiB
    assert "mem=60Gi" in a1 and "mem=10Gi" in a1 and "mem=5Gi" in a1 and "mem=45Gi" in a1
    assert "1 running, 0 pending" in a1 and a1.rstrip().endswith("50")
    assert await ctl("provider", "rm", "prod-yarn") == 0
    assert await ctl("provider", "test", "prod-yarn") == 1
    assert "NOT_FOUND" in capsys.readouterr().err


async def test_queue_view_shows_yarn_figures_in_flight_and_last_fetch(rm, capacity, capsys):
    import rmctl

    state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=0))
    state.start_app("root.a.a1", 20 * 1024, 4)
    state.start_app("root.a.a1", 1024, 1, state="ACCEPTED")
    await apply(rm, "root.a.a1", 6)

    record = await label_state(rm, A1)

    q = record.external_queue
    assert (q.queue, q.scheduler, q.error) == ("root.a.a1", "capacity", "")
    assert q.yarn_max.yarn.queue_memory_bytes == 60 * GiB
    assert q.yarn_used.yarn.queue_memory_bytes == 20 * GiB
    assert q.in_flight.yarn.queue_memory_bytes == 6 * GiB
    assert q.left.yarn.queue_memory_bytes == 34 * GiB
    assert (q.apps_running, q.apps_pending) == (1, 1)  # numActive/numPendingApplications
    assert await asyncio.to_thread(rmctl.main, ["--rm", rm.target, "resource", "show", A1]) == 0
    shown = capsys.readouterr().out
    assert "labelrm in flight = queue=root.a.a1 mem=6Gi" in shown
    assert "yarn apps         = 1 running, 1 pending" in shown
    fetched = (await label_state(rm, A1)).external_queue.fetch_time.ToDatetime()

    pair.stop()  # YARN away: the record still shows, with the last good figures and why
    record = await label_state(rm, A1)
    assert "unavailable" in record.external_queue.error
    assert record.external_queue.fetch_time.ToDatetime() == fetched
    listed = await rm.rm.ListLabelResources(
        resource_manager_pb2.ListLabelResourcesRequest(source="external")
    )
    assert [r.label for r in listed.label_resources] == [A1]


async def test_a_waiting_apply_is_granted_when_yarn_frees_the_queue(rm, capacity):
    """YARN tells nobody when an application ends: a waiting apply looks again each TTL."""
    state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=0.2))
    app = state.start_app("root.a.a1", 55 * 1024, 1)

    async def wait_for_room() -> Any:
        return await rm.rm.Apply(apply_req(USER + ",cluster=prod", dy("root.a.a1", 10), wait=30))

    waiting = asyncio.create_task(wait_for_room())
    fetches = pair.rm1.count("/ws/v1/cluster/scheduler")

    async def looked_again():  # it found the queue full, and looked at YARN again since
        return pair.rm1.count("/ws/v1/cluster/scheduler") >= fetches + 2

    await wait_until(looked_again, timeout=10)
    assert not waiting.done()
    state.finish_app(app)
    granted = await asyncio.wait_for(waiting, timeout=20)
    assert granted.ticket.requested_resource.driver_and_yarn.yarn.queue_memory_bytes == 10 * GiB


async def test_per_user_queue_caps_are_ordinary_label_limits(rm, capacity):
    _, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=0))
    cap = resource_pb2.Resource(
        yarn=resource_pb2.YarnResource(
            queue_memory_bytes=10 * GiB, queue_cpu_millis=100_000, queue_instances=100
        )
    )
    await rm.admin.SetLabelLimit(limit_req("userCreator=alice-*,engineType=*", cap))
    assert (await apply(rm, "root.a.a1", 8)).ticket.ticket_id
    with pytest.raises(grpc.aio.AioRpcError) as capped:  # the queue has room, alice does not
        await apply(rm, "root.a.a1", 4)
    _, shortfalls = details(capped.value)
    assert [(s.label, s.dimension) for s in shortfalls] == [(USER, "yarn.memory_bytes")]
    bob = "userCreator=bob-IDE,engineType=spark-3.2.1,cluster=prod"
    assert (await apply(rm, "root.a.a1", 4, labels=bob)).ticket.ticket_id


async def test_metrics_export_queue_figures_without_asking_yarn(database_url, capacity):
    from tests.integration.test_metrics import scrape, value
    from tests.support.rm import start_in_process, stop_in_process

    state, pair = capacity
    rm = await start_in_process(database_url, metrics_listen="127.0.0.1:0")
    try:
        await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=300))
        state.start_app("root.a.a1", 10 * 1024, 3, state="ACCEPTED")
        await apply(rm, "root.a.a1", 5)
        fetches = pair.rm1.count("/ws/v1/cluster/scheduler")

        samples = await scrape(rm)

        q = {"provider": "prod-yarn", "queue": "root.a.a1"}
        assert (
            value(samples, "labelrm_external_queue_max", **q, dimension="yarn.memory_bytes")
            == 60 * GiB
        )
        assert value(samples, "labelrm_external_queue_apps", **q, state="pending") == 1
        assert value(samples, "labelrm_external_fetches_total", provider="prod-yarn") == 1
        assert (
            value(samples, "labelrm_external_last_fetch_timestamp_seconds", provider="prod-yarn")
            > 0
        )
        in_flight = value(
            samples,
            "labelrm_label_locked",
            label=A1,
            source="external",
            dimension="yarn.memory_bytes",
        )
        assert in_flight == 5 * GiB
        assert pair.rm1.count("/ws/v1/cluster/scheduler") == fetches  # the scrape asked nobody
    finally:
        await stop_in_process(rm)


async def test_two_replicas_never_share_a_queue_headroom(rm, capacity):
    """Each replica has its own cache of YARN's figures; the in-flight part is read from the
    shared record under its row lock, so replicas cannot over-grant either."""
    from tests.support.rm import start_in_process, stop_in_process

    state, pair = capacity
    await rm.admin.PutExternalProvider(provider(pair.addresses, ttl=300))
    state.start_app("root.a.a1", 40 * 1024, 10)  # 20 GiB left
    other = await start_in_process(rm.database_url)
    try:
        results = await asyncio.gather(
            *(apply(r, "root.a.a1", 3) for _ in range(8) for r in (rm, other)),
            return_exceptions=True,
        )
        granted = [r for r in results if not isinstance(r, BaseException)]
        assert len(granted) == 6  # 6 x 3 GiB <= 20 GiB < 7 x 3 GiB
        assert all(
            r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            for r in results
            if isinstance(r, grpc.aio.AioRpcError)
        )
        assert pair.rm1.count("/ws/v1/cluster/scheduler") == 2  # one fetch per replica
        await assert_consistent(rm)
    finally:
        await stop_in_process(other)
