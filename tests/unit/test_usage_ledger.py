"""The usage ledger's arithmetic (rm_server/domain/usage.py), without I/O: spans cut at
the hours add up exactly, a ticket's resource-seconds are its phases' quantities times
their lengths whatever hours they cross, measured usage is spread without loss, and
the sum of ledgers does not depend on the order they are added in."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.resources import Resource
from rm_server.domain.usage import (
    HOUR,
    Amounts,
    DemandTransition,
    EndedEngineConn,
    EndedTicket,
    demand_usage,
    engine_conn_usage,
    hour_of,
    merge,
    micros,
    names_of,
    share,
    split_hours,
    ticket_usage,
)

BASE = datetime(2026, 3, 1, 22, 17, 3, 250_000, tzinfo=UTC)
LABELS = [["userCreator", "alice-IDE"], ["engineType", "spark-3.2.1"], ["emInstance", "h1:9101"]]
CHARGED = ("emInstance=h1:9101", "userCreator=alice-IDE,engineType=spark-3.2.1")

offsets = st.integers(min_value=0, max_value=3 * 86400 * 10**6).map(
    lambda us: BASE + timedelta(microseconds=us)
)


@given(offsets, st.integers(min_value=0, max_value=2 * 86400 * 10**6))
def test_split_hours_cuts_at_hours_and_adds_up(start, length_us):
    end = start + timedelta(microseconds=length_us)
    pieces = split_hours(start, end)
    assert sum(us for _, us in pieces) == length_us
    assert pieces[0][0] == hour_of(start)
    for (a, _), (b, _) in itertools.pairwise(pieces):
        assert b - a == HOUR
    assert all(0 <= us <= 3600 * 10**6 for _, us in pieces)


@given(st.integers(min_value=0, max_value=10**30), st.lists(st.integers(0, 10**12), min_size=1))
def test_share_is_exact_and_never_negative(total, weights):
    parts = share(total, weights)
    assert sum(parts) == total and all(p >= 0 for p in parts)


def _ticket(
    created: datetime,
    reported_after: int | None,
    ended_after: int,
    measured: tuple[int, int] | None = None,
) -> EndedTicket:
    reported = None if reported_after is None else created + timedelta(microseconds=reported_after)
    return EndedTicket(
        user="alice",
        user_creator="alice-IDE",
        engine_type="spark-3.2.1",
        charged_labels=CHARGED,
        requested=Resource.load(4 * 1024**3, 2000),
        used=None if reported is None else Resource.load(1024**3, 500),
        created_at=created,
        reported_at=reported,
        ended_at=created + timedelta(microseconds=ended_after),
        measured_memory=None if measured is None else measured[0],
        measured_cpu=None if measured is None else measured[1],
    )


@given(
    offsets,
    st.integers(0, 86400 * 10**6),
    st.integers(0, 86400 * 10**6),
    st.booleans(),
    st.none() | st.tuples(st.integers(0, 10**20), st.integers(0, 10**12)),
)
def test_a_tickets_resource_seconds_are_exact_on_every_row(created, a, b, reported, measured):
    locked_us, used_us = (a, b) if reported else (a + b, 0)
    t = _ticket(created, a if reported else None, a + b, measured)
    ledger = ticket_usage(t)
    rows: dict[str, Amounts] = {}
    for key, amounts in ledger.items():
        assert (key.user, key.user_creator, key.engine_type) == (
            "alice",
            "alice-IDE",
            "spark-3.2.1",
        )
        rows[key.label] = rows.get(key.label, Amounts()) + amounts
    assert set(rows) == {"", *CHARGED}  # the "" row, and each charged label's
    total = rows[""]
    assert all(rows[label] == total for label in CHARGED)
    memory = 4 * 1024**3 * locked_us + 1024**3 * used_us
    cpu = 2000 * locked_us + 500 * used_us
    assert {d: v for d, v in total.granted.items() if v} == {
        d: v for d, v in {"memory_bytes": memory, "cpu_millis": cpu}.items() if v
    }
    assert total.tickets == 1
    assert total.measured_memory == (measured[0] if measured else 0)
    assert total.measured_cpu == (measured[1] if measured else 0)
    assert total.measured_granted_memory == (memory if measured else 0)


def test_an_engineconn_counts_once_and_its_life_per_hour():
    ec = EndedEngineConn("", *names_of(LABELS), BASE, BASE + timedelta(hours=2), failed=True)
    ledger = engine_conn_usage(ec)
    assert [k.hour for k in ledger] == [hour_of(BASE) + HOUR * i for i in range(3)]
    assert {k.user for k in ledger} == {"alice"}  # no user named: the userCreator's
    total = merge([ledger])
    amounts = sum(total.values(), Amounts())
    assert (amounts.engine_conns, amounts.engine_conns_failed) == (1, 1)
    assert amounts.engine_conn_time == 2 * 3600 * 10**6


def test_demand_transitions_count_in_their_hour():
    planned = demand_usage(DemandTransition("bob", "", "", "ACCEPTED", BASE))
    failed = demand_usage(DemandTransition("bob", "", "", "FAILED", BASE))
    assert demand_usage(DemandTransition("bob", "", "", "MONITORING", BASE)) == {}
    total = merge([planned, failed])
    ((key, amounts),) = total.items()
    assert key.hour == hour_of(BASE) and key.label == ""
    assert (amounts.demands_planned, amounts.demands_failed) == (1, 1)


@given(st.permutations(range(4)))
def test_merging_does_not_depend_on_order(order):
    ledgers = [
        ticket_usage(_ticket(BASE + timedelta(minutes=37 * i), 10**7, 5 * 10**9)) for i in range(4)
    ]
    assert merge(ledgers[i] for i in order) == merge(ledgers)


def test_micros_never_negative():
    assert micros(BASE, BASE - timedelta(seconds=1)) == 0
