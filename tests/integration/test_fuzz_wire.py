"""Property: whatever a caller sends, through the wire contract alone, the RM answers with
a status it chose: never INTERNAL or UNKNOWN, never a crash, never a traceback in its log,
and CheckConsistency stays clean.

Requests are drawn from the descriptors of every method of every service the RM serves
(every field of every request message, nested messages, repeated fields, maps, oneofs,
open enums, Durations and Timestamps at and past their bounds, strings with NULs), and as
raw random bytes. The budget is bounded and derandomized: the same examples each run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2_grpc

from rm_server.server import SERVICE_NAMES
from tests.support.messages import (
    GiB,
    apply_req,
    lbl,
    limit_req,
    load,
    load_instance,
    present,
    register,
)

CALL_TIMEOUT = 0.5  # seconds: Applies that wait, launches without an agent, streams
MAX_DEPTH = 3
EXAMPLES = 400

FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}

# Values that reach past the first checks: known label keys and values, the seeded ECM,
# wildcards, ids, and the edges (empty, NUL, too long, not UTF-8-safe looking text).
WORDS = [
    "", "\0", "a\0b", "*", "userCreator", "alice-IDE", "engineType", "spark-3.2.1",
    "emInstance", "host1:9000", "ghost:1", "userCreator=alice-IDE,engineType=spark-3.2.1",
    "emInstance=host1:9000", "root.q1", "gpu", "alice", "t-1", "d-1", "x" * 300, "é漢",
    "YWZ0ZXI6", "after:", "LOCKED", "ecm", "limit",
]  # fmt: skip
INT64_EDGES = [0, 1, -1, 2, 1000, GiB, 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63)]
NANOS_EDGES = [0, 1, -1, 999_999_999, -999_999_999, 1_000_000_000, -1_000_000_000, 2**31 - 1]


def _methods() -> list[MethodDescriptor]:
    pool = descriptor_pool.Default()
    names = (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
    return [m for name in names for m in pool.FindServiceByName(name).methods]


METHODS = _methods()


# Filled by the fixture (ids only known once the RM made them); read at the first draw.
KNOWN_TICKETS: list[str] = ["t-none"]

_SMALL = st.one_of(st.integers(0, 4), st.integers(0, 16 * GiB))
# Plausible values by field name, drawn as often as the generic ones: they carry a call
# past the first checks into the store (grants, refusals, waits, ECM and limit changes).
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "key": st.sampled_from(["userCreator", "engineType", "emInstance", "cluster"]),
    "value": st.sampled_from(["alice-IDE", "bob-IDE", "spark-3.2.1", "host1:9000", "c1", "*"]),
    "ticket_id": st.deferred(lambda: st.sampled_from(KNOWN_TICKETS)),
    "instance": st.sampled_from(["host1:9000", "host2:9000"]),
    "agent_id": st.sampled_from(["host1:9000", "host2:9000"]),
    "user": st.sampled_from(["alice", "bob"]),
    "request_id": st.text(alphabet="ab12-", min_size=1, max_size=6),
    "queue_name": st.sampled_from(["root.q1", ""]),
    "memory_bytes": _SMALL,
    "cpu_millis": _SMALL,
    "instances": _SMALL,
    "queue_memory_bytes": _SMALL,
    "seconds": st.integers(0, 3),
    "sequence": st.integers(1, 5),
    "page_size": st.integers(0, 3),
}


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    plausible = PLAUSIBLE.get(field.name)
    if plausible is not None:
        return st.one_of(plausible, _any_scalar(field))
    return _any_scalar(field)


def _any_scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(WORDS), st.text(max_size=12))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=16)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:  # proto3 enums are open: unknown numbers too
        known = [v.number for v in present(field.enum_type).values]
        return st.one_of(st.sampled_from(known), st.integers(-3, 40))
    if t in (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        if field.name == "nanos":
            return st.sampled_from(NANOS_EDGES)
        return st.one_of(
            st.sampled_from([0, 1, -1, 10, 1000, 2**31 - 1, -(2**31)]),
            st.integers(-(2**31), 2**31 - 1),
        )
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    return st.one_of(st.sampled_from(INT64_EDGES), st.integers(-(2**63), 2**63 - 1))


def _field_value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(present(field.message_type), depth + 1)
    return _scalar(field)


def _set_field(draw: Any, msg: Message, field: FieldDescriptor, depth: int) -> None:
    """Give `field` of `msg` a drawn value (replacing what it held)."""
    msg.ClearField(field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_f = field.message_type.fields_by_name["key"]
        value_f = field.message_type.fields_by_name["value"]
        values = (
            messages(present(value_f.message_type), depth + 1)
            if value_f.type == FieldDescriptor.TYPE_MESSAGE
            else _any_scalar(value_f)  # a map entry's "key" and "value" are not names
        )
        target = getattr(msg, field.name)
        for k, v in draw(st.dictionaries(_any_scalar(key_f), values, max_size=3)).items():
            if value_f.type == FieldDescriptor.TYPE_MESSAGE:
                target[k].CopyFrom(v)
            else:
                target[k] = v
    elif field.is_repeated:
        items = draw(st.lists(_field_value(field, depth), max_size=3))
        target = getattr(msg, field.name)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in items:
                target.add().CopyFrom(item)
        else:
            target.extend(items)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        getattr(msg, field.name).CopyFrom(draw(_field_value(field, depth)))
    else:
        setattr(msg, field.name, draw(_field_value(field, depth)))


def _some_fields(draw: Any, descriptor: Descriptor, most: int) -> list[FieldDescriptor]:
    fields = list(descriptor.fields)
    if not fields:
        return []
    return list(draw(st.lists(st.sampled_from(fields), max_size=most, unique=True)))


@st.composite
def _message(draw: Any, descriptor: Descriptor, depth: int) -> Message:
    msg = GetMessageClass(descriptor)()
    if depth <= MAX_DEPTH:
        for field in _some_fields(draw, descriptor, len(descriptor.fields)):
            _set_field(draw, msg, field, depth)
    return msg


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`'s type with any subset of its fields set, recursively."""
    return _message(descriptor, depth)


def _templates() -> dict[str, Message]:
    """A valid request per method that takes one worth reaching the store with."""
    from labelrm.v1 import demand_pb2, engine_conn_pb2
    from labelrm.v1 import resource_manager_pb2 as rm_pb

    user = "userCreator=alice-IDE,engineType=spark-3.2.1"
    labels = lbl(f"{user},emInstance=host1:9000")
    shell = lbl("userCreator=alice-IDE,engineType=shell-1")
    return {
        "Apply": apply_req(f"{user},emInstance=host1:9000", load(GiB, 1000), user="alice"),
        "RegisterEcm": register("host2:9000", load_instance(8 * GiB, 8000, 8)),
        "SetLabelLimit": limit_req("userCreator=*,engineType=*", load(8 * GiB, 8000)),
        "DeleteLabelLimit": admin_pb2.DeleteLabelLimitRequest(labels=lbl("userCreator=*,engineType=*")),
        "GetLabelResource": rm_pb.GetLabelResourceRequest(labels=lbl(user)),
        "Heartbeat": rm_pb.HeartbeatRequest(agent_id="host1:9000", sequence=1),
        "SubmitDemand": demand_pb2.SubmitDemandRequest(
            demand_id="d-1", user="alice", labels=labels, resource=load(GiB, 1000),
            time_conditions_text="{Start: [+1m, +1m], Duration: +1m}",
        ),
        "CreateEngineConn": engine_conn_pb2.CreateEngineConnRequest(user="alice", labels=shell),
        "AskEngineConn": engine_conn_pb2.AskEngineConnRequest(user="alice", labels=shell),
    }  # fmt: skip


TEMPLATES = _templates()


@st.composite
def _mutated(draw: Any, template: Message) -> Message:
    """`template` (valid) with one or two of its fields given drawn values."""
    msg = type(template)()
    msg.CopyFrom(template)
    # protobuf's stubs type DESCRIPTOR as either implementation's Descriptor.
    descriptor = cast(Descriptor, template.DESCRIPTOR)
    for field in _some_fields(draw, descriptor, 2):
        _set_field(draw, msg, field, 1)
    return msg


@st.composite
def calls(draw: Any) -> tuple[MethodDescriptor, list[bytes]]:
    """One call: a method, and the request bytes (several for a client stream): a drawn
    message, a valid one with a field or two drawn, or raw random bytes."""
    method = draw(st.sampled_from(METHODS))
    count = draw(st.integers(1, 3)) if method.client_streaming else 1
    template = TEMPLATES.get(method.name)
    payloads = []
    for _ in range(count):
        how = draw(st.integers(0, 5))
        if how == 0:
            payloads.append(draw(st.binary(max_size=48)))
        elif template is not None and how >= 3:
            payloads.append(draw(_mutated(template)).SerializeToString())
        else:
            payloads.append(draw(messages(method.input_type)).SerializeToString())
    return method, payloads


def _path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def invoke(
    channel: grpc.Channel, method: MethodDescriptor, payloads: list[bytes]
) -> grpc.StatusCode:
    """Send raw bytes; the status the call ended with (OK, or the error's code)."""
    path = _path(method)
    try:
        if method.client_streaming and method.server_streaming:
            for _ in channel.stream_stream(path)(iter(payloads), timeout=CALL_TIMEOUT):
                pass
        elif method.server_streaming:
            for _ in channel.unary_stream(path)(payloads[0], timeout=CALL_TIMEOUT):
                break  # a long-lived stream (agent commands): its first answer is enough
        elif method.client_streaming:
            channel.stream_unary(path)(iter(payloads), timeout=CALL_TIMEOUT)
        else:
            channel.unary_unary(path)(payloads[0], timeout=CALL_TIMEOUT)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.fixture
def fuzz_rm(rm_process_factory: Any) -> Iterator[tuple[Any, grpc.Channel]]:
    """A real rm-server process, seeded with an ECM, a limit and a live ticket."""
    rm = rm_process_factory("--lock-timeout", "600")
    rm.start()
    with grpc.insecure_channel(rm.target) as channel:
        stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        stub.RegisterEcm(register("host1:9000", load_instance(64 * GiB, 64000, 64)))
        admin.SetLabelLimit(limit_req("userCreator=*,engineType=*", load(8 * GiB, 8000)))
        labels = "userCreator=alice-IDE,engineType=spark-3.2.1,emInstance=host1:9000"
        for _ in range(3):
            KNOWN_TICKETS.append(stub.Apply(apply_req(labels, load(GiB, 1000))).ticket.ticket_id)
        yield rm, channel


def test_no_request_gets_internal_or_unknown_and_the_store_stays_consistent(fuzz_rm):
    rm, channel = fuzz_rm
    seen: dict[str, set[str]] = {}

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )
    @given(calls())
    def one_call(call: tuple[MethodDescriptor, list[bytes]]) -> None:
        method, payloads = call
        code = invoke(channel, method, payloads)
        seen.setdefault(method.name, set()).add(code.name)
        assert code not in FORBIDDEN, f"{_path(method)} answered {code.name} to {payloads!r}"
        assert rm.proc.poll() is None, "rm-server died"

    one_call()
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    report = admin.CheckConsistency(admin_pb2.CheckConsistencyRequest(), timeout=10)
    assert report.consistent, [str(m) for m in report.mismatches]
    log = rm.log_path.read_text()
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]
    # The budget reached every method, and past the first checks on most of them.
    assert len(seen) == len(METHODS), sorted({m.name for m in METHODS} - set(seen))
    deep = {name for name, codes in seen.items() if codes - {"INVALID_ARGUMENT"}}
    assert len(deep) >= 0.7 * len(METHODS), {k: sorted(v) for k, v in sorted(seen.items())}
