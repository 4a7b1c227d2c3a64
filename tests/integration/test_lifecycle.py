"""Apply -> ReportUsed -> Release through the real gRPC server, for every resource type."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from labelrm.v1 import admin_pb2, resource_manager_pb2, resource_pb2

from tests.support.env import BOTH_PATHS
from tests.support.messages import GiB, apply_req, lbl, limit_req, load, load_instance, register
from tests.support.refusals import refused as refusal
from tests.support.rm import assert_consistent, label_state

pytestmark = BOTH_PATHS

R = resource_pb2
USER = "userCreator=alice-IDE,engineType=spark-3.2.1"
COMBINED = "userCreator=alice-IDE,engineType=spark-3.2.1"

# (max, request, used) per resource type: used <= request <= max in every dimension.
CASES = {
    "memory": ("memory", R.MemoryResource(memory_bytes=8 * GiB), R.MemoryResource(memory_bytes=3 * GiB), R.MemoryResource(memory_bytes=2 * GiB)),
    "cpu": ("cpu", R.CpuResource(cpu_millis=8000), R.CpuResource(cpu_millis=1500), R.CpuResource(cpu_millis=1000)),
    "load": ("load", R.LoadResource(memory_bytes=8 * GiB, cpu_millis=8000), R.LoadResource(memory_bytes=GiB, cpu_millis=2000), R.LoadResource(memory_bytes=GiB, cpu_millis=1000)),
    "instance": ("instance", R.InstanceResource(instances=5), R.InstanceResource(instances=2), R.InstanceResource(instances=1)),
    "load_instance": ("load_instance", R.LoadInstanceResource(memory_bytes=8 * GiB, cpu_millis=8000, instances=4), R.LoadInstanceResource(memory_bytes=GiB, cpu_millis=1000, instances=1), R.LoadInstanceResource(memory_bytes=GiB // 2, cpu_millis=500, instances=1)),
    "yarn": ("yarn", R.YarnResource(queue_name="root.default", queue_memory_bytes=64 * GiB, queue_cpu_millis=32000, queue_instances=20), R.YarnResource(queue_name="root.default", queue_memory_bytes=4 * GiB, queue_cpu_millis=4000, queue_instances=2), R.YarnResource(queue_name="root.default", queue_memory_bytes=2 * GiB, queue_cpu_millis=2000, queue_instances=2)),
    "driver_and_yarn": ("driver_and_yarn",
        R.DriverAndYarnResource(driver=R.LoadInstanceResource(memory_bytes=8 * GiB, cpu_millis=8000, instances=4), yarn=R.YarnResource(queue_name="q1", queue_memory_bytes=64 * GiB, queue_cpu_millis=32000, queue_instances=20)),
        R.DriverAndYarnResource(driver=R.LoadInstanceResource(memory_bytes=GiB, cpu_millis=1000, instances=1), yarn=R.YarnResource(queue_name="q1", queue_memory_bytes=4 * GiB, queue_cpu_millis=4000, queue_instances=2)),
        R.DriverAndYarnResource(driver=R.LoadInstanceResource(memory_bytes=GiB, cpu_millis=1000, instances=1), yarn=R.YarnResource(queue_name="q1", queue_memory_bytes=GiB, queue_cpu_millis=1000, queue_instances=1))),
    "special": ("special", R.SpecialResource(quantities={"gpu": 4, "license": 10}), R.SpecialResource(quantities={"gpu": 2, "license": 1}), R.SpecialResource(quantities={"gpu": 1, "license": 1})),
}  # fmt: skip


def wrap(field: str, msg) -> resource_pb2.Resource:
    return resource_pb2.Resource(**{field: msg})


def as_json(msg: Any) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


@pytest.mark.parametrize("kind", sorted(CASES))
async def test_full_lifecycle_for_each_resource_type(rm, kind):
    field, maximum, request, used = CASES[kind]
    maximum, request, used = wrap(field, maximum), wrap(field, request), wrap(field, used)
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", maximum))

    applied = await rm.rm.Apply(apply_req(USER, request, request_id=f"apply-{kind}"))
    ticket = applied.ticket
    assert ticket.state == resource_manager_pb2.TICKET_STATE_LOCKED
    assert list(ticket.charged_labels) == [COMBINED]
    assert as_json(ticket.requested_resource) == as_json(request)
    state = await label_state(rm, COMBINED)
    assert as_json(state.locked_resource) == as_json(request)
    assert state.live_tickets == 1
    await assert_consistent(rm)

    reported = await rm.rm.ReportUsed(
        resource_manager_pb2.ReportUsedRequest(ticket_id=ticket.ticket_id, used_resource=used)
    )
    assert reported.ticket.state == resource_manager_pb2.TICKET_STATE_USED
    state = await label_state(rm, COMBINED)
    assert as_json(state.used_resource) == as_json(used)
    assert not any(v for v in _numbers(state.locked_resource))
    await assert_consistent(rm)

    released = await rm.rm.Release(resource_manager_pb2.ReleaseRequest(ticket_id=ticket.ticket_id))
    assert released.ticket.state == resource_manager_pb2.TICKET_STATE_RELEASED
    state = await label_state(rm, COMBINED)
    assert not any(v for v in _numbers(state.used_resource))
    assert state.live_tickets == 0
    assert as_json(state.left_resource) == as_json(state.max_resource)
    # History keeps the ended ticket; a second Release is a no-op returning it.
    again = await rm.rm.Release(resource_manager_pb2.ReleaseRequest(ticket_id=ticket.ticket_id))
    assert again.ticket.state == resource_manager_pb2.TICKET_STATE_RELEASED
    got = await rm.rm.GetTicket(resource_manager_pb2.GetTicketRequest(ticket_id=ticket.ticket_id))
    assert got.ticket.end_reason == "released"
    await assert_consistent(rm)


def _numbers(msg) -> list[int]:
    out: list[int] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, str) and value.isdigit():
            out.append(int(value))
        elif isinstance(value, int):
            out.append(value)

    walk(json_format.MessageToDict(msg))
    return out


async def test_ecm_protected_capacity_is_never_handed_out(rm):
    await rm.rm.RegisterEcm(
        register("host1:9000", load_instance(10 * GiB, 8000, 10), load_instance(2 * GiB, 0, 0))
    )
    labels = USER + ",emInstance=host1:9000"
    first = await rm.rm.Apply(apply_req(labels, load(8 * GiB, 1000)))
    assert list(first.ticket.charged_labels) == ["emInstance=host1:9000"]  # no limit on COMBINED
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rm.rm.Apply(apply_req(labels, load(1, 1000)))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "emInstance=host1:9000 memory_bytes: requested 1, available 0" in refused.value.details()
    ecm = await label_state(rm, "emInstance=host1:9000")
    assert ecm.left_resource.load_instance.memory_bytes == 0
    assert ecm.locked_resource.load_instance.memory_bytes == 8 * GiB
    await assert_consistent(rm)


async def test_refusal_names_every_label_and_dimension_and_changes_nothing(rm):
    await rm.rm.RegisterEcm(register("host1:9000", load_instance(4 * GiB, 4000, 4)))
    await rm.admin.SetLabelLimit(limit_req("userCreator=alice-*,engineType=*", load(GiB, 1000)))
    before = await rm.rm.ListLabelResources(resource_manager_pb2.ListLabelResourcesRequest())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rm.rm.Apply(apply_req(USER + ",emInstance=host1:9000", load(8 * GiB, 500)))
    err = refused.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    from grpc_status import rpc_status

    status = rpc_status.from_call(err)
    shortfalls = None
    for detail in status.details:
        if detail.Is(resource_pb2.Shortfalls.DESCRIPTOR):
            shortfalls = resource_pb2.Shortfalls()
            detail.Unpack(shortfalls)
    assert shortfalls is not None
    got = {(s.label, s.dimension, s.requested, s.available) for s in shortfalls.shortfalls}
    assert got == {
        (COMBINED, "memory_bytes", 8 * GiB, GiB),
        ("emInstance=host1:9000", "memory_bytes", 8 * GiB, 4 * GiB),
    }
    after = await rm.rm.ListLabelResources(resource_manager_pb2.ListLabelResourcesRequest())
    assert [as_json(r) | {"update_time": None} for r in after.label_resources] == [
        as_json(r) | {"update_time": None} for r in before.label_resources
    ] or len(after.label_resources) == len(before.label_resources) + 1
    for record in after.label_resources:
        assert record.live_tickets == 0
        assert not any(_numbers(record.locked_resource))
    await assert_consistent(rm)


async def test_labels_without_record_or_limit_are_skipped(rm):
    applied = await rm.rm.Apply(apply_req(USER + ",cluster=c1", load(GiB, 100)))
    assert list(applied.ticket.charged_labels) == []
    await rm.rm.Release(resource_manager_pb2.ReleaseRequest(ticket_id=applied.ticket.ticket_id))
    await assert_consistent(rm)


async def test_most_specific_limit_wins_and_changes_apply_without_restart(rm):
    await rm.admin.SetLabelLimit(
        limit_req("userCreator=*,engineType=spark-3.2.1", load(10 * GiB, 10000))
    )
    await rm.admin.SetLabelLimit(
        limit_req("userCreator=alice-*,engineType=spark-3.2.1", load(2 * GiB, 2000))
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rm.rm.Apply(apply_req(USER, load(3 * GiB, 100)))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    bob = await rm.rm.Apply(
        apply_req("userCreator=bob-IDE,engineType=spark-3.2.1", load(3 * GiB, 100))
    )
    assert bob.ticket.charged_labels == ["userCreator=bob-IDE,engineType=spark-3.2.1"]
    # Raise alice's limit: the next apply sees it.
    resp = await rm.admin.SetLabelLimit(
        limit_req("userCreator=alice-*,engineType=spark-3.2.1", load(4 * GiB, 2000))
    )
    assert resp.affected_labels == 1
    ok = await rm.rm.Apply(apply_req(USER, load(3 * GiB, 100)))
    assert ok.ticket.state == resource_manager_pb2.TICKET_STATE_LOCKED
    limits = await rm.admin.ListLabelLimits(admin_pb2.ListLabelLimitsRequest())
    assert [lim.pattern for lim in limits.limits] == [
        "userCreator=*,engineType=spark-3.2.1",
        "userCreator=alice-*,engineType=spark-3.2.1",
    ]
    # Delete the specific one: the general one (10 GiB) now governs alice.
    await rm.admin.DeleteLabelLimit(
        admin_pb2.DeleteLabelLimitRequest(labels=lbl("userCreator=alice-*,engineType=spark-3.2.1"))
    )
    state = await label_state(rm, COMBINED)
    assert state.max_resource.load.memory_bytes == 10 * GiB
    await assert_consistent(rm)


async def test_unregister_releases_live_tickets_and_removes_the_record(rm):
    await rm.rm.RegisterEcm(register("host2:9000", load_instance(4 * GiB, 4000, 4)))
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(8 * GiB, 8000)))
    t1 = await rm.rm.Apply(apply_req(USER + ",emInstance=host2:9000", load(GiB, 100)))
    resp = await rm.rm.UnregisterEcm(
        resource_manager_pb2.UnregisterEcmRequest(instance="host2:9000")
    )
    assert list(resp.released_ticket_ids) == [t1.ticket.ticket_id]
    combined = await label_state(rm, COMBINED)
    assert combined.live_tickets == 0 and combined.locked_resource.load.memory_bytes == 0
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await label_state(rm, "emInstance=host2:9000")
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    got = await rm.rm.GetTicket(
        resource_manager_pb2.GetTicketRequest(ticket_id=t1.ticket.ticket_id)
    )
    assert got.ticket.state == resource_manager_pb2.TICKET_STATE_RELEASED
    assert got.ticket.end_reason == "ECM unregistered"
    await assert_consistent(rm)


async def test_reregister_applies_a_changed_total(rm):
    first = await rm.rm.RegisterEcm(register("host3:9000", load_instance(4 * GiB, 4000, 4)))
    assert not first.resource_changed
    same = await rm.rm.RegisterEcm(register("host3:9000", load_instance(4 * GiB, 4000, 4)))
    assert not same.resource_changed
    bigger = await rm.rm.RegisterEcm(register("host3:9000", load_instance(8 * GiB, 4000, 4)))
    assert bigger.resource_changed
    state = await label_state(rm, "emInstance=host3:9000")
    assert state.max_resource.load_instance.memory_bytes == 8 * GiB


async def test_list_tickets_paginates(rm):
    ids = set()
    for _ in range(7):
        t = await rm.rm.Apply(apply_req(USER, load(1, 1)))
        ids.add(t.ticket.ticket_id)
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await rm.rm.ListTickets(
            resource_manager_pb2.ListTicketsRequest(page_size=3, page_token=token)
        )
        pages += 1
        seen.extend(t.ticket_id for t in page.tickets)
        token = page.next_page_token
        if not token:
            break
    assert pages == 3
    assert seen == sorted(ids)


async def test_a_limit_limits_only_the_dimensions_it_names(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(2 * GiB, 2000)))
    ok = await rm.rm.Apply(apply_req(USER, load_instance(GiB, 1000, 1)))
    assert ok.ticket.charged_labels == [COMBINED]
    err = await refusal(
        rm.rm.Apply(apply_req(USER, load_instance(2 * GiB, 1000, 1))),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "INSUFFICIENT_RESOURCE",
    )
    assert "memory_bytes" in err.details()
    assert "instances" not in err.details()
    await assert_consistent(rm)
