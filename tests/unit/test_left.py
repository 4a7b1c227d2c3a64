"""What a label record has left (`model.left_of`: what ListLabelResources, GetEcm, the
ECM ranking and the console show) is what the ledger grants: an Apply of a resource
fits exactly when that resource is within what is left, reservations included."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.ledger import LabelAccount, check_accounts
from rm_server.domain.model import LabelResource, left_of
from rm_server.domain.resources import Resource

Q = st.integers(0, 64)
LOAD = st.builds(Resource.load, Q, Q)


@given(
    maximum=LOAD, used=LOAD, locked=LOAD, protected=LOAD, reserved=st.none() | LOAD,
    request=LOAD, source=st.sampled_from(["ecm", "limit"]),
)  # fmt: skip
def test_left_is_what_an_apply_may_take(
    maximum, used, locked, protected, reserved, request, source
):
    account = LabelAccount("l", source, maximum, protected, used, locked, 1, reserved=reserved)
    left = left_of(maximum, used, locked, protected, reserved)
    assert left is not None and all(v >= 0 for _, v in left.quantities)
    fits = check_accounts([account], request) is None
    assert fits == left.ge(request)


def test_reservations_count_and_a_record_without_maximum_has_no_left():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    gib = 1024**3
    record = LabelResource(
        "emInstance=n1", "ecm", Resource.load(4 * gib, 4000), Resource.load(0, 0),
        Resource.load(gib, 0), Resource.load(0, 0), 1, at, reserved=Resource.load(gib, 0),
    )  # fmt: skip
    assert record.left() == Resource.load(2 * gib, 4000)
    assert (
        left_of(None, Resource.load(1, 1), Resource.load(0, 0), Resource.load(0, 0), None) is None
    )
    # Parts that do not combine (a yarn resource on a load record): no figure, no error.
    yarn = Resource.yarn("q", 1, 1, 1)
    assert (
        left_of(Resource.load(4, 4), yarn, Resource.load(0, 0), Resource.load(0, 0), None) is None
    )
