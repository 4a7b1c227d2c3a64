"""The console's pure conversions: the limit that applies to a label (the admission's
choice), and live tickets summed per group."""

from __future__ import annotations

from datetime import UTC, datetime

from rm_server.console import views
from rm_server.domain.labels import Label
from rm_server.domain.model import StoredLimit, Ticket, TicketState
from rm_server.domain.resources import Resource

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GiB = 1024**3


def _limit(pattern: str) -> StoredLimit:
    return StoredLimit(pattern, Resource.memory(GiB), NOW)


def test_the_most_specific_matching_limit_applies():
    limits = [
        _limit("userCreator=*,engineType=*"),
        _limit("userCreator=alice-*,engineType=*"),
        _limit("userCreator=*,engineType=spark-*"),
        _limit("emInstance=*"),
    ]
    label = "userCreator=alice-IDE,engineType=shell-1"
    assert views.winning_limit(label, limits) == "userCreator=alice-*,engineType=*"
    assert views.winning_limit("emInstance=node1", limits) == "emInstance=*"
    assert views.winning_limit("engineType=shell-1", limits) == ""
    assert views.winning_limit("not a label", limits) == ""


def _ticket(user: str, engine: str, memory: int, used: int | None) -> Ticket:
    labels = (Label("userCreator", f"{user}-IDE"), Label("engineType", engine))
    return Ticket(
        ticket_id=f"t-{user}-{engine}-{memory}",
        state=TicketState.USED if used is not None else TicketState.LOCKED,
        user=user,
        labels=labels,
        charged_labels=(),
        requested=Resource.memory(memory),
        locked=Resource.memory(memory) if used is None else Resource.memory(0),
        used=Resource.load(used, 100) if used is not None else None,
        created_at=NOW,
        updated_at=NOW,
    )


def test_totals_add_dimensions_by_name_across_kinds():
    tickets = [
        _ticket("alice", "shell-1", GiB, None),
        _ticket("alice", "spark-3", 2 * GiB, 2 * GiB),
        _ticket("bob", "shell-1", GiB, None),
    ]
    by_user = views.totals_by(tickets, lambda t: t.user)
    assert by_user["alice"] == {
        "tickets": 2,
        "locked": {"memory_bytes": GiB},
        "used": {"memory_bytes": 2 * GiB, "cpu_millis": 100},
    }
    by_engine = views.totals_by(tickets, views.engine_type)
    assert by_engine["shell-1"]["tickets"] == 2
    assert by_engine["shell-1"]["locked"] == {"memory_bytes": 2 * GiB}
