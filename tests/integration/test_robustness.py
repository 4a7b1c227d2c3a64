"""No input crashes, confuses or silently corrupts the RM: bad bytes and bad values get
INVALID_ARGUMENT naming the field (one log line, nothing changed), and label records
never change their meaning (one type per record, ECM labels that must name a live ECM,
limits that are honoured or refused, failures stored under a request id by one rule)."""

from __future__ import annotations

import asyncio
import base64
import logging

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from labelrm.v1 import admin_pb2
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_pb2 as R

import rmctl
from tests.support.messages import GiB, apply_req, lbl, limit_req, load, load_instance, register
from tests.support.refusals import bad_field, refused
from tests.support.rm import assert_consistent, label_state, snapshot
from tests.support.waiting import wait_until

USER = "userCreator=alice-IDE,engineType=spark-3.2.1"
ECM = "host1:9000"
ECM_LABEL = f"emInstance={ECM}"
MAX = 2**63 - 1


def reason(err: grpc.aio.AioRpcError) -> str:
    for detail in rpc_status.from_call(err).details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


@pytest.fixture
async def seeded(rm):
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    held = await rm.rm.Apply(apply_req(f"{USER},{ECM_LABEL}", load(GiB, 1000)))
    return rm, held.ticket


# ----- bad input ---------------------------------------------------------------------------


def token(after: str) -> str:
    """A page token as the server makes them, around `after`."""
    return base64.urlsafe_b64encode(f"after:{after}".encode()).decode()


NUL_CASES = [
    ("Apply", "request_id", lambda t: apply_req(USER, load(1, 1), request_id="a\0b")),
    ("Apply", "user", lambda t: apply_req(USER, load(1, 1), user="alice\0")),
    ("Apply", "labels[1].value", lambda t: apply_req("userCreator=alice-IDE,engineType=x\0y", load(1, 1))),
    ("ReportUsed", "ticket_id", lambda t: pb.ReportUsedRequest(ticket_id=t + "\0")),
    ("Release", "ticket_id", lambda t: pb.ReleaseRequest(ticket_id="\0" + t)),
    ("Release", "request_id", lambda t: pb.ReleaseRequest(ticket_id=t, request_id="r\0")),
    ("GetTicket", "ticket_id", lambda t: pb.GetTicketRequest(ticket_id=t + "\0")),
    ("ListTickets", "page_token", lambda t: pb.ListTicketsRequest(page_token=token("t\0"))),
    ("ListTickets", "user", lambda t: pb.ListTicketsRequest(user="a\0")),
    ("ListEcms", "page_token", lambda t: pb.ListEcmsRequest(page_token=token("h\0"))),
]  # fmt: skip


@pytest.mark.parametrize("case", NUL_CASES, ids=[f"{c[0]}.{c[1]}" for c in NUL_CASES])
async def test_a_nul_in_a_string_is_invalid_argument_naming_the_field(seeded, case):
    rm, held = seeded
    method, field, build = case
    before = await snapshot(rm)
    err = await refused(
        getattr(rm.rm, method)(build(held.ticket_id)), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert bad_field(err) == field
    assert await snapshot(rm) == before
    await assert_consistent(rm)


async def test_a_nul_in_a_streamed_heartbeat_ends_the_stream_naming_the_field(seeded):
    rm, _ = seeded
    stream = rm.rm.HeartbeatStream()
    beat = pb.HeartbeatRequest(agent_id=ECM, sequence=1, done_command_ids=["c\0"])
    await stream.write(pb.HeartbeatStreamRequest(heartbeat=beat))
    err = await refused(stream.read(), grpc.StatusCode.INVALID_ARGUMENT)
    assert bad_field(err) == "heartbeat.done_command_ids[0]"


RAW_METHODS = [
    "/labelrm.v1.ResourceManagerService/Apply",
    "/labelrm.v1.ResourceManagerService/GetTicket",
    "/labelrm.v1.AdminService/SetLabelLimit",
    "/labelrm.v1.AdminService/CheckConsistency",
    "/labelrm.v1.EngineConnService/CreateEngineConn",
    "/labelrm.v1.DemandService/SubmitDemand",
]


@pytest.mark.parametrize("method", RAW_METHODS)
async def test_bytes_that_are_not_a_message_get_invalid_argument_and_one_log_line(
    seeded, method, caplog
):
    rm, _ = seeded
    before = await snapshot(rm)
    call = rm.channel.unary_unary(method)  # raw bytes in and out

    def mine() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name.startswith(("labelrm", "rm_server", "grpc"))]

    async def both_logged() -> bool:
        return len(mine()) >= 2

    caplog.clear()
    with caplog.at_level(logging.INFO):
        # a field 1 of wire type 7 (no such type), and a length running past the end
        for garbage in (b"\x0f\xff\xff\xff", b"\x0a\xff\x01abc"):
            err = await refused(call(garbage), grpc.StatusCode.INVALID_ARGUMENT)
            assert bad_field(err) == "request"
            assert "is not a valid" in err.details()
        # The access line is written as the call ends on the server, which may be just
        # after the client has its answer: wait for both (still capturing INFO).
        await wait_until(both_logged, 10)
    assert len(mine()) == 2, [r.getMessage() for r in mine()]  # one access line per call
    assert all(r.exc_info is None and r.levelno < logging.ERROR for r in mine())
    assert await snapshot(rm) == before


@pytest.mark.parametrize(
    ("seconds", "nanos", "field"),
    [
        (0, 1_500_000_000, "wait_timeout.nanos"),  # more than a second of nanos
        (1, -1, "wait_timeout.nanos"),  # signs disagree
        (-1, 999_999_999, "wait_timeout.nanos"),
        (0, -1_000_000_000, "wait_timeout.nanos"),
    ],
)
async def test_an_invalid_duration_is_refused_not_read_as_another_wait(
    seeded, seconds, nanos, field
):
    rm, _ = seeded
    request = pb.ApplyRequest(
        labels=lbl(USER), resource=load(GiB, 1), wait_timeout=Duration(seconds=seconds, nanos=nanos)
    )
    err = await refused(rm.rm.Apply(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert bad_field(err) == field


async def test_a_sum_past_the_largest_quantity_is_resource_exhausted_naming_the_dimension(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(MAX, MAX)))
    await rm.rm.Apply(apply_req(USER, load(MAX - 5, 1)))
    # The limit goes while the ticket lives: the record stays, with no maximum.
    await rm.admin.DeleteLabelLimit(
        admin_pb2.DeleteLabelLimitRequest(labels=lbl("userCreator=*,engineType=*"))
    )
    before = await snapshot(rm)
    err = await refused(
        rm.rm.Apply(apply_req(USER, load(10, 1))), grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert f"{USER} memory_bytes: requested 10, available 5" in err.details()
    assert await snapshot(rm) == before
    await assert_consistent(rm)


# ----- records never change meaning --------------------------------------------------------


def dy(driver_mem: int, yarn_mem: int, queue: str = "root.q1") -> R.Resource:
    return R.Resource(
        driver_and_yarn=R.DriverAndYarnResource(
            driver=R.LoadInstanceResource(memory_bytes=driver_mem, cpu_millis=1000, instances=1),
            yarn=R.YarnResource(
                queue_name=queue, queue_memory_bytes=yarn_mem, queue_cpu_millis=8000
            ),
        )
    )


async def test_driver_and_yarn_charges_only_its_driver_to_the_ecm(rm):
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    ticket = (await rm.rm.Apply(apply_req(f"{USER},{ECM_LABEL}", dy(GiB, 100 * GiB)))).ticket
    assert list(ticket.charged_labels) == [ECM_LABEL]
    state = await label_state(rm, ECM_LABEL)
    assert state.locked_resource.WhichOneof("kind") == "load_instance"
    assert state.locked_resource.load_instance.memory_bytes == GiB
    assert state.left_resource.load_instance.memory_bytes == 7 * GiB
    await assert_consistent(rm)
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=ticket.ticket_id))
    state = await label_state(rm, ECM_LABEL)
    for part in (state.locked_resource, state.used_resource, state.left_resource):
        assert part.WhichOneof("kind") == "load_instance"  # never turns into driver_and_yarn
    assert state.left_resource.load_instance.memory_bytes == 8 * GiB
    await assert_consistent(rm)


async def test_what_does_not_fit_an_ecm_record_is_refused(rm):
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    before = await snapshot(rm)
    yarn = R.Resource(yarn=R.YarnResource(queue_name="root.q1", queue_memory_bytes=100 * GiB))
    err = await refused(
        rm.rm.Apply(apply_req(f"{USER},{ECM_LABEL}", yarn)), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "yarn" in err.details() and ECM_LABEL in err.details()
    empty = R.Resource(driver_and_yarn=R.DriverAndYarnResource())
    err = await refused(
        rm.rm.Apply(apply_req(f"{USER},{ECM_LABEL}", empty)), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert bad_field(err) == "resource.driver_and_yarn.driver"
    no_yarn = R.Resource(
        driver_and_yarn=R.DriverAndYarnResource(driver=R.LoadInstanceResource(instances=1))
    )
    err = await refused(
        rm.rm.Apply(apply_req(f"{USER},{ECM_LABEL}", no_yarn)), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert bad_field(err) == "resource.driver_and_yarn.yarn"
    assert await snapshot(rm) == before


async def test_an_ecm_cannot_change_its_resource_type_under_live_tickets(rm):
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    ticket = (await rm.rm.Apply(apply_req(ECM_LABEL, load_instance(GiB, 1000, 1)))).ticket
    memory = R.Resource(memory=R.MemoryResource(memory_bytes=16 * GiB))
    err = await refused(
        rm.rm.RegisterEcm(register(ECM, memory)), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert "load_instance" in err.details()
    state = await label_state(rm, ECM_LABEL)
    assert state.max_resource.WhichOneof("kind") == "load_instance"
    await assert_consistent(rm)
    # Once none is left, it may: the record then holds the new type, from zero.
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=ticket.ticket_id))
    await rm.rm.RegisterEcm(register(ECM, memory))
    state = await label_state(rm, ECM_LABEL)
    kinds = {
        p.WhichOneof("kind")
        for p in (state.max_resource, state.locked_resource, state.used_resource)
    }
    assert kinds == {"memory"}
    await assert_consistent(rm)


async def test_an_apply_naming_an_unregistered_ecm_is_not_found(rm):
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    await rm.rm.UnregisterEcm(pb.UnregisterEcmRequest(instance=ECM))
    before = await snapshot(rm)
    err = await refused(
        rm.rm.Apply(apply_req(f"{USER},{ECM_LABEL}", load(GiB, 1))), grpc.StatusCode.NOT_FOUND
    )
    assert ECM in err.details()
    err = await refused(
        rm.rm.Apply(apply_req("emInstance=never:1", load(GiB, 1))), grpc.StatusCode.NOT_FOUND
    )
    assert await snapshot(rm) == before
    # Other labels without a record are still skipped: no record, no limit.
    granted = await rm.rm.Apply(apply_req("cluster=c1,team=t1", load(GiB, 1)))
    assert list(granted.ticket.charged_labels) == []


async def test_an_apply_naming_a_lost_or_draining_ecm_is_failed_precondition(rm_manual_clock):
    rm = rm_manual_clock
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    await rm.rm.RegisterEcm(register("host2:9000", load_instance(8 * GiB, 8000, 8)))
    rm.clock.advance(rm.server.settings.ecm_expiry + 1)
    await rm.rm.RegisterEcm(register("host2:9000", load_instance(8 * GiB, 8000, 8)))  # beats again
    await rm.server.hub.sweep()  # host1 silent past the expiry: LOST
    err = await refused(
        rm.rm.Apply(apply_req(ECM_LABEL, load(GiB, 1), request_id="lost-1")),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert reason(err) == "ECM_NOT_RUNNING" and "LOST" in err.details()
    # Transient: not stored under its request id; once the ECM is back, the retry goes.
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8)))
    await rm.rm.Apply(apply_req(ECM_LABEL, load(GiB, 1), request_id="lost-1"))
    await rm.admin.DecommissionEcm(admin_pb2.DecommissionEcmRequest(instance="host2:9000"))
    err = await refused(
        rm.rm.Apply(apply_req("emInstance=host2:9000", load(GiB, 1))),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert "DRAINING" in err.details()
    await assert_consistent(rm)


async def test_limits_on_ecm_labels_are_refused(rm):
    for pattern in ("emInstance=*", f"emInstance={ECM}"):
        err = await refused(
            rm.admin.SetLabelLimit(limit_req(pattern, load_instance(GiB, 1, 1))),
            grpc.StatusCode.INVALID_ARGUMENT,
        )
        assert bad_field(err) == "labels"
    listed = await rm.admin.ListLabelLimits(admin_pb2.ListLabelLimitsRequest())
    assert not listed.limits


async def test_a_limit_lowered_below_usage_is_reported_apart_from_inconsistencies(rm, capsys):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    await rm.rm.Apply(apply_req(USER, load(3 * GiB, 100)))
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(GiB, 4000)))
    report = await assert_consistent(rm)
    assert [(m.label, m.field) for m in report.over_limit] == [(USER, "over_max")]
    assert not report.mismatches
    # Nothing more is granted there meanwhile.
    await refused(rm.rm.Apply(apply_req(USER, load(1, 1))), grpc.StatusCode.RESOURCE_EXHAUSTED)
    capsys.readouterr()
    code = await asyncio.to_thread(rmctl.main, ["--rm", rm.target, "check"])
    out = capsys.readouterr()
    assert code == 0
    assert "consistent" in out.out and USER in out.out
    assert "over their limit" in out.err


async def test_a_transient_refusal_is_not_stored_under_its_request_id(rm):
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(GiB, 4000)))
    await refused(
        rm.rm.Apply(apply_req(USER, load(2 * GiB, 100), request_id="big")),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    await rm.admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(4 * GiB, 4000)))
    granted = await rm.rm.Apply(apply_req(USER, load(2 * GiB, 100), request_id="big"))
    again = await rm.rm.Apply(apply_req(USER, load(2 * GiB, 100), request_id="big"))
    assert again.ticket == granted.ticket  # a success is stored
    # A definitive failure is stored too: the same request id answers the same.
    for _ in range(2):
        await refused(
            rm.rm.Release(pb.ReleaseRequest(ticket_id="t-none", request_id="rel")),
            grpc.StatusCode.NOT_FOUND,
        )
    await assert_consistent(rm)


async def test_a_method_listed_but_not_implemented_is_unimplemented_without_a_traceback(rm, caplog):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with caplog.at_level(logging.INFO):
        await refused(
            health_pb2_grpc.HealthStub(rm.channel).List(health_pb2.HealthListRequest()),
            grpc.StatusCode.UNIMPLEMENTED,
        )
    assert all(r.exc_info is None and r.levelno < logging.ERROR for r in caplog.records)


async def test_protected_capacity_of_another_type_is_invalid_argument(rm):
    yarn = R.Resource(yarn=R.YarnResource(queue_name="root.q1", queue_memory_bytes=GiB))
    request = register(ECM, load_instance(8 * GiB, 8000, 8), protected=yarn)
    err = await refused(rm.rm.RegisterEcm(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert bad_field(err) == "protected_resource"
    # A narrower type widens to the total's: the record keeps one type.
    memory = R.Resource(memory=R.MemoryResource(memory_bytes=GiB))
    await rm.rm.RegisterEcm(register(ECM, load_instance(8 * GiB, 8000, 8), protected=memory))
    state = await label_state(rm, ECM_LABEL)
    assert state.protected_resource.load_instance.memory_bytes == GiB
    await assert_consistent(rm)


async def test_a_limit_of_another_type_cannot_apply_under_live_tickets(rm):
    pattern = "userCreator=*,engineType=*"
    await rm.admin.SetLabelLimit(limit_req(pattern, load(4 * GiB, 4000)))
    ticket = (await rm.rm.Apply(apply_req(USER, load(GiB, 100)))).ticket
    gpus = R.Resource(special=R.SpecialResource(quantities={"gpu": 4}))
    err = await refused(
        rm.admin.SetLabelLimit(limit_req(pattern, gpus)), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert reason(err) == "LIMIT_TYPE_IN_USE"
    limits = await rm.admin.ListLabelLimits(admin_pb2.ListLabelLimitsRequest())
    assert [lim.max_resource.WhichOneof("kind") for lim in limits.limits] == ["load"]  # unchanged
    state = await label_state(rm, USER)  # still readable: its meaning did not change
    assert state.left_resource.load.memory_bytes == 3 * GiB
    await assert_consistent(rm)
    await rm.rm.Release(pb.ReleaseRequest(ticket_id=ticket.ticket_id))
    await rm.admin.SetLabelLimit(limit_req(pattern, gpus))  # idle: the record takes the type
    state = await label_state(rm, USER)
    assert state.left_resource.special.quantities["gpu"] == 4
    await assert_consistent(rm)
