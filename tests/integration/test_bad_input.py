"""Bad input gets a clear status naming the field, and changes nothing."""

from __future__ import annotations

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_pb2

from tests.support.messages import GiB, apply_req, lbl, limit_req, load, load_instance, register
from tests.support.refusals import bad_field
from tests.support.rm import assert_consistent, snapshot

USER = "userCreator=alice-IDE,engineType=spark-3.2.1"


@pytest.fixture
async def seeded(rm):
    await rm.rm.RegisterEcm(register("host1:9000", load_instance(8 * GiB, 8000, 8)))
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    held = await rm.rm.Apply(apply_req(USER + ",emInstance=host1:9000", load(GiB, 1000)))
    return rm, held.ticket


def resource(**kw) -> resource_pb2.Resource:
    return resource_pb2.Resource(**kw)


INVALID_APPLIES = [
    ("negative", apply_req(USER, load(-1, 10)), "resource.load.memory_bytes"),
    ("negative cpu", apply_req(USER, load(1, -5)), "resource.load.cpu_millis"),
    ("unset oneof", apply_req(USER, resource()), "resource"),
    ("negative special", apply_req(USER, resource(special=resource_pb2.SpecialResource(quantities={"gpu": -1}))), "resource.special.quantities[gpu]"),
    ("bad special name", apply_req(USER, resource(special=resource_pb2.SpecialResource(quantities={"a b": 1}))), "resource.special.quantities[a b]"),
    ("no labels", pb.ApplyRequest(resource=load(1, 1)), "labels"),
    ("empty value", apply_req("userCreator=,engineType=spark-3.2.1", load(1, 1)), "labels[0].value"),
    ("malformed userCreator", apply_req("userCreator=root;rm,engineType=spark-3.2.1", load(1, 1)), "labels[0].value"),
    ("bad key", apply_req("9key=x", load(1, 1)), "labels[0].key"),
    ("duplicate key", apply_req("cluster=a,cluster=b", load(1, 1)), "labels[1].key"),
    ("too long", apply_req("cluster=" + "x" * 300, load(1, 1)), "labels[0].value"),
    ("too many", apply_req(",".join(f"k{i}=v" for i in range(40)), load(1, 1)), "labels"),
    ("negative wait", pb.ApplyRequest(labels=lbl(USER), resource=load(1, 1), wait_timeout={"seconds": -1}), "wait_timeout"),
]  # fmt: skip


@pytest.mark.parametrize("case", INVALID_APPLIES, ids=[c[0] for c in INVALID_APPLIES])
async def test_invalid_apply_names_the_field_and_changes_nothing(seeded, case):
    rm, _ = seeded
    _, request, field = case
    before = await snapshot(rm)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.Apply(request)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(exc.value) == field, exc.value.details()
    assert await snapshot(rm) == before
    await assert_consistent(rm)


async def test_unknown_ticket_is_not_found(seeded):
    rm, _ = seeded
    for call, req in (
        (rm.rm.ReportUsed, pb.ReportUsedRequest(ticket_id="t-nope")),
        (rm.rm.Release, pb.ReleaseRequest(ticket_id="t-nope")),
        (rm.rm.GetTicket, pb.GetTicketRequest(ticket_id="t-nope")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call(req)
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND


async def test_report_on_a_ticket_not_locked_is_failed_precondition(seeded):
    rm, ticket = seeded
    await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=ticket.ticket_id))
    before = await snapshot(rm)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=ticket.ticket_id))
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "USED" in exc.value.details()
    assert await snapshot(rm) == before
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=ticket.ticket_id))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=ticket.ticket_id))
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await assert_consistent(rm)


async def test_reporting_more_than_locked_is_refused(seeded):
    rm, ticket = seeded
    before = await snapshot(rm)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.ReportUsed(
            pb.ReportUsedRequest(ticket_id=ticket.ticket_id, used_resource=load(2 * GiB, 1))
        )
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await snapshot(rm) == before


async def test_reporting_another_resource_type_is_invalid(seeded):
    rm, ticket = seeded
    yarn = resource(yarn=resource_pb2.YarnResource(queue_name="q", queue_memory_bytes=1))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.ReportUsed(pb.ReportUsedRequest(ticket_id=ticket.ticket_id, used_resource=yarn))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_resource_type_that_cannot_combine_with_a_label_is_invalid(seeded):
    rm, _ = seeded
    yarn = resource(yarn=resource_pb2.YarnResource(queue_name="q", queue_memory_bytes=1))
    before = await snapshot(rm)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.Apply(apply_req(USER + ",emInstance=host1:9000", yarn))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(exc.value) == "resource"
    assert await snapshot(rm) == before


async def test_invalid_registration(rm):
    cases = [
        (register("bad host", load_instance(1, 1, 1)), "instance"),
        (register("h:1", resource_pb2.Resource()), "total_resource"),
        (register("h:1", load_instance(1, 1, 1), load_instance(2, 0, 0)), "protected_resource"),
        (register("h:99999", load_instance(1, 1, 1)), "instance"),
    ]
    for request, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await rm.rm.RegisterEcm(request)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_field(exc.value) == field
    records = await rm.rm.ListLabelResources(pb.ListLabelResourcesRequest())
    assert list(records.label_resources) == []


async def test_bad_page_token_and_size(rm):
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.ListTickets(pb.ListTicketsRequest(page_token="%%%"))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await rm.rm.ListTickets(pb.ListTicketsRequest(page_size=-1))
    assert bad_field(exc.value) == "page_size"
