"""What a label record is charged for a request (domain.admission.charged_part) and the
wire's NUL walk (service.wire.nul_field): pure functions, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_pb2

from rm_server.domain.admission import ECM_SOURCE, charged_part
from rm_server.domain.resources import Resource, ResourceKind, ResourceTypeError, convert
from rm_server.service.wire import nul_field

GiB = 1024**3
ECM_TOTAL = Resource.load_instance(8 * GiB, 8000, 8)

quantities = st.integers(0, 2**40)
requests = st.one_of(
    st.builds(Resource.memory, quantities),
    st.builds(Resource.cpu, quantities),
    st.builds(Resource.load, quantities, quantities),
    st.builds(Resource.instance, quantities),
    st.builds(Resource.load_instance, quantities, quantities, quantities),
    st.builds(
        Resource.driver_and_yarn,
        st.builds(Resource.load_instance, quantities, quantities, quantities),
        st.builds(
            Resource.yarn, st.sampled_from(["", "root.q1"]), quantities, quantities, quantities
        ),
    ),
)


@given(requests)
def test_an_ecm_record_is_charged_in_its_own_type_only(request):
    part = charged_part(ECM_SOURCE, ECM_TOTAL, request)
    assert part.kind is ResourceKind.LOAD_INSTANCE
    driver = request.driver_part() if request.kind is ResourceKind.DRIVER_AND_YARN else request
    assert part == convert(driver, ResourceKind.LOAD_INSTANCE)  # no yarn quantity on it


@given(requests)
def test_other_records_take_the_whole_request(request):
    assert charged_part("limit", ECM_TOTAL, request) is request


@pytest.mark.parametrize(
    "request_",
    [
        Resource.yarn("root.q1", GiB, 0, 0),
        Resource.special({"gpu": 1}),
    ],
)
def test_what_does_not_fit_an_ecm_record_raises(request_):
    with pytest.raises(ResourceTypeError):
        charged_part(ECM_SOURCE, ECM_TOTAL, request_)


def test_a_narrower_ecm_refuses_a_wider_request():
    with pytest.raises(ResourceTypeError):
        charged_part(ECM_SOURCE, Resource.memory(GiB), Resource.load(1, 1))


def test_nul_field_names_the_path_at_any_depth():
    apply = pb.ApplyRequest(
        labels=[resource_pb2.Label(key="a", value="b"), resource_pb2.Label(key="c", value="d\0")]
    )
    assert nul_field(apply) == "labels[1].value"
    special = resource_pb2.Resource(special=resource_pb2.SpecialResource(quantities={"g\0": 1}))
    assert nul_field(pb.ApplyRequest(resource=special)) == "resource.special.quantities"
    stream = pb.HeartbeatStreamRequest(heartbeat=pb.HeartbeatRequest(done_command_ids=["x", "\0"]))
    assert nul_field(stream) == "heartbeat.done_command_ids[1]"
    assert nul_field(pb.ApplyRequest(user="alice", request_id="r-1")) is None


def test_an_apply_must_name_registered_running_ecms():
    from rm_server.domain.errors import EcmNotRegistered, EcmNotRunning
    from rm_server.domain.ledger import LabelAccount, check_ecms

    key = "emInstance=host1:9000"
    zero = Resource.zero(ResourceKind.LOAD_INSTANCE)
    ecm = LabelAccount(key, ECM_SOURCE, ECM_TOTAL, zero, zero, zero, 0, ecm_state="RUNNING")
    check_ecms((key, "cluster=c1"), {key: ecm})  # other labels without a record: skipped
    with pytest.raises(EcmNotRegistered):
        check_ecms((key,), {})
    with pytest.raises(EcmNotRegistered):  # a limit's record is not an ECM
        check_ecms((key,), {key: LabelAccount(key, "limit", ECM_TOTAL, zero, zero, zero, 0)})
    for state in ("LOST", "DRAINING"):
        with pytest.raises(EcmNotRunning) as exc:
            check_ecms(
                (key,),
                {
                    key: LabelAccount(
                        key, ECM_SOURCE, ECM_TOTAL, zero, zero, zero, 0, ecm_state=state
                    )
                },
            )
        assert exc.value.transient and exc.value.state == state
