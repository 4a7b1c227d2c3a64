"""The console's pure conversions: the limit that applies to a label (the admission's
choice), the cluster's totals and a label's load (reservations held back, as the API's
left_resource), the text a row shows (what the filter searches), and demands keyed by
user and id."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rm_server.app.listings import GroupTotal
from rm_server.console import views
from rm_server.domain.labels import Label
from rm_server.domain.model import LabelResource, StoredLimit, Ticket, TicketState
from rm_server.domain.resources import Resource

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GiB = 1024**3


def _limit(pattern: str) -> StoredLimit:
    return StoredLimit(pattern, Resource.memory(GiB), NOW)


def test_the_most_specific_matching_limit_applies():
    limits = views.limit_rules(
        [
            _limit("userCreator=*,engineType=*"),
            _limit("userCreator=alice-*,engineType=*"),
            _limit("userCreator=*,engineType=spark-*"),
            _limit("emInstance=*"),
        ]
    )
    label = "userCreator=alice-IDE,engineType=shell-1"
    assert views.winning_limit(label, limits) == "userCreator=alice-*,engineType=*"
    assert views.winning_limit("emInstance=node1", limits) == "emInstance=*"
    assert views.winning_limit("engineType=shell-1", limits) == ""
    assert views.winning_limit("not a label", limits) == ""


def _record(label: str, reserved: Resource | None, used: int = GiB) -> LabelResource:
    zero = Resource.load(0, 0)
    return LabelResource(
        label, "ecm", Resource.load(8 * GiB, 8000), zero, Resource.load(used, 1000), zero, 1,
        NOW, reserved,
    )  # fmt: skip


def test_cluster_totals_and_load_hold_reservations_back():
    records = [_record("emInstance=a", Resource.load(GiB, 0)), _record("emInstance=b", None)]
    totals = views.cluster_totals(records)
    assert totals["memory_bytes"] == {
        "max": 16 * GiB, "used": 2 * GiB, "locked": 0, "reserved": GiB, "protected": 0,
        "left": 16 * GiB - 2 * GiB - GiB,
    }  # fmt: skip
    assert views.label_resource(records[0])["left"]["dims"]["memory_bytes"] == 6 * GiB
    assert views.load(records[0]) == 2 / 8 and views.load(records[1]) == 1 / 8


def _ticket(state: TicketState) -> Ticket:
    return Ticket(
        ticket_id="t-1", state=state, user="alice",
        labels=(Label("userCreator", "alice-IDE"), Label("engineType", "shell-1")),
        charged_labels=(), requested=Resource.memory(GiB), locked=Resource.memory(GiB),
        used=None, created_at=NOW, updated_at=NOW,
    )  # fmt: skip


def test_a_row_is_searched_by_what_it_shows_never_by_its_keys():
    row = views.ticket_row(_ticket(TicketState.LOCKED))
    assert "used" in row.json  # a field every ticket has ...
    assert "used" not in row.text  # ... which the filter does not see
    assert {"t-1", "alice", "locked", "usercreator=alice-ide"} <= set(row.text.split())


def test_totals_list_the_largest_groups_first():
    groups = {"bob": GroupTotal(1, {}, {}), "alice": GroupTotal(3, {"memory_bytes": GiB}, {})}
    out = views.totals(groups, 7)
    assert [g["id"] for g in out["groups"]] == ["alice", "bob"] and out["count"] == 7


def test_usage_says_when_its_samples_are():
    since = NOW - timedelta(minutes=59)
    out = views.usage({"memory_bytes": [0, GiB]}, since, 60.0)
    assert out == {"since": since.isoformat(), "step_s": 60.0, "dims": {"memory_bytes": [0, GiB]}}
