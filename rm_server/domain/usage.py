"""Usage accounting: what an ended ticket, EngineConn or demand adds to the hourly ledger.

The ledger (store/usage.py, table usage_hour) holds, per hour, user, userCreator,
engineType and label, the resource-seconds granted (locked, then used once reported),
what the EngineConns' agents measured (memory-seconds, CPU-seconds), EngineConn counts
and time, and demand counts; like YARN's per-application memory-seconds and
vcore-seconds and Slurm's hourly usage rollups (sreport), and kept after the history
it comes from is deleted.

Every amount is an exact integer in "times microseconds" (a 1 GiB lock held 1.5 s adds
1 GiB x 1,500,000): sums are exact whatever the order they are added in, and a span
that crosses hours is split at the hours without rounding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from rm_server.domain.labels import ENGINE_TYPE, USER_CREATOR
from rm_server.domain.resources import CPU, MEMORY, Resource

HOUR = timedelta(hours=1)
ZERO = timedelta(0)
MICROSECOND = timedelta(microseconds=1)
US_PER_SECOND = 1_000_000
# What the report groups by: a column of the ledger (one key per group).
GROUPINGS = ("user", "user_creator", "engine_type", "label", "hour")


class UsageKey(NamedTuple):
    """One ledger row: `label` is a charged label, or "" for the row counting each
    ticket once."""

    hour: datetime
    user: str
    user_creator: str
    engine_type: str
    label: str


@dataclass(frozen=True)
class Amounts:
    """What one ledger row adds up (the columns of usage_hour, same units)."""

    tickets: int = 0
    granted: Mapping[str, int] = field(default_factory=dict)  # dimension -> quantity x us
    measured_memory: int = 0  # byte x us
    measured_cpu: int = 0  # CPU us
    measured_granted_memory: int = 0  # memory_bytes x us of the measured tickets
    measured_granted_cpu: int = 0  # cpu_millis x us of the measured tickets
    engine_conns: int = 0
    engine_conns_failed: int = 0
    engine_conn_time: int = 0  # us
    demands_planned: int = 0
    demands_allocated: int = 0
    demands_failed: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        granted = dict(self.granted)
        for dim, amount in other.granted.items():
            granted[dim] = granted.get(dim, 0) + amount
        return Amounts(
            self.tickets + other.tickets,
            granted,
            self.measured_memory + other.measured_memory,
            self.measured_cpu + other.measured_cpu,
            self.measured_granted_memory + other.measured_granted_memory,
            self.measured_granted_cpu + other.measured_granted_cpu,
            self.engine_conns + other.engine_conns,
            self.engine_conns_failed + other.engine_conns_failed,
            self.engine_conn_time + other.engine_conn_time,
            self.demands_planned + other.demands_planned,
            self.demands_allocated + other.demands_allocated,
            self.demands_failed + other.demands_failed,
        )


Ledger = dict[UsageKey, Amounts]


@dataclass(frozen=True)
class EndedTicket:
    """A ticket's history row as the ledger reads it. `measured_memory` (byte x us) and
    `measured_cpu` (us) are None when no agent measured it (not an EngineConn's, or its
    node is not contained)."""

    user: str
    user_creator: str  # the request's userCreator value ("" when none): names_of
    engine_type: str
    charged_labels: tuple[str, ...]
    requested: Resource
    used: Resource | None
    created_at: datetime
    reported_at: datetime | None
    ended_at: datetime
    measured_memory: int | None = None
    measured_cpu: int | None = None


@dataclass(frozen=True)
class EndedEngineConn:
    user: str
    user_creator: str
    engine_type: str
    created_at: datetime
    ended_at: datetime
    failed: bool  # ended FAILED or LOST


@dataclass(frozen=True)
class DemandTransition:
    """A demand entering ACCEPTED (planned), ALLOCATED or FAILED."""

    user: str
    user_creator: str
    engine_type: str
    to_state: str
    at: datetime


def hour_of(t: datetime) -> datetime:
    """The start of the UTC hour `t` falls in."""
    if t.utcoffset() != ZERO:  # the database's timestamps are already UTC
        t = t.astimezone(UTC)
    return t.replace(minute=0, second=0, microsecond=0)


def micros(start: datetime, end: datetime) -> int:
    """Whole microseconds from `start` to `end` (0 when `end` is not after `start`)."""
    return max(0, (end - start) // MICROSECOND)


def split_hours(start: datetime, end: datetime) -> list[tuple[datetime, int]]:
    """The span [start, end) cut at each hour: (hour, microseconds in it), in order; a
    span of no length is one piece of 0 in `start`'s hour."""
    hour = hour_of(start)
    nxt = hour + HOUR
    if end <= nxt:  # within one hour: most tickets
        return [(hour, micros(start, end))]
    pieces: list[tuple[datetime, int]] = []
    at = start
    while True:
        nxt = hour + HOUR
        if end <= nxt:
            pieces.append((hour, micros(at, end)))
            return pieces
        pieces.append((hour, micros(at, nxt)))
        hour, at = nxt, nxt


def share(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights`, in integers that add up to `total`
    exactly (the remainder of the rounding goes to the last share; all to the last
    when the weights are all 0)."""
    whole = sum(weights)
    if not weights:
        return []
    if whole == 0:
        return [0] * (len(weights) - 1) + [total]
    parts = [total * w // whole for w in weights]
    parts[-1] += total - sum(parts)
    return parts


def names_of(labels: Iterable[Sequence[str]]) -> tuple[str, str]:
    """The userCreator and engineType values of stored [key, value] labels ("" when
    absent); read as stored, without validating them again."""
    user_creator = engine_type = ""
    for key, value in labels:
        if key == USER_CREATOR:
            user_creator = value
        elif key == ENGINE_TYPE:
            engine_type = value
    return user_creator, engine_type


def _user(user: str, user_creator: str) -> str:
    """The request's user, else its userCreator's (without authentication requests name
    none)."""
    return user or user_creator.rpartition("-")[0]


def _granted_by_hour(
    t: EndedTicket, life: list[tuple[datetime, int]]
) -> list[tuple[datetime, dict[str, int]]]:
    """Per hour of the ticket's `life` (split_hours of it), quantity x us per dimension:
    `requested` while locked (until reported, or until it ended unreported), then
    `used`."""
    start, end = t.created_at, max(t.created_at, t.ended_at)
    phases: list[tuple[datetime, datetime, Resource]] = []
    if t.used is None or t.reported_at is None:
        phases.append((start, end, t.requested))
    else:  # clamped into the ticket's life (replicas' clocks may differ a little)
        reported = min(max(t.reported_at, start), end)
        phases.append((start, reported, t.requested))
        phases.append((reported, end, t.used))
    by_hour: dict[datetime, dict[str, int]] = {h: {} for h, _ in life}
    for begin, finish, resource in phases:
        for hour, us in split_hours(begin, finish):
            if not us:
                continue
            row = by_hour[hour]
            for dim, qty in resource.quantities:
                row[dim] = row.get(dim, 0) + qty * us
    return list(by_hour.items())  # in the order of `life`: by hour


def ticket_usage(t: EndedTicket) -> Ledger:
    """What an ended ticket adds: its granted resource per hour of its life, on the ""
    row and on each charged label's; its measured usage spread over the same hours in
    proportion to their length; one ticket in its first hour."""
    user, user_creator, engine_type = _user(t.user, t.user_creator), t.user_creator, t.engine_type
    life = split_hours(t.created_at, max(t.created_at, t.ended_at))
    hours = _granted_by_hour(t, life)
    measured = t.measured_memory is not None or t.measured_cpu is not None
    lengths = [us for _, us in life]
    memory = share(t.measured_memory or 0, lengths)
    cpu = share(t.measured_cpu or 0, lengths)
    ledger: Ledger = {}
    for i, (hour, granted) in enumerate(hours):
        amounts = Amounts(
            tickets=1 if i == 0 else 0,
            granted=granted,
            measured_memory=memory[i],
            measured_cpu=cpu[i],
            measured_granted_memory=granted.get(MEMORY, 0) if measured else 0,
            measured_granted_cpu=granted.get(CPU, 0) if measured else 0,
        )
        for label in ("", *t.charged_labels):  # distinct keys: no sum needed
            ledger[UsageKey(hour, user, user_creator, engine_type, label)] = amounts
    return ledger


def engine_conn_usage(ec: EndedEngineConn) -> Ledger:
    """What an ended EngineConn adds on the "" row: one EngineConn (and one failed) in
    its first hour, its life per hour."""
    user, user_creator, engine_type = (
        _user(ec.user, ec.user_creator),
        ec.user_creator,
        ec.engine_type,
    )
    ledger: Ledger = {}
    for i, (hour, us) in enumerate(split_hours(ec.created_at, max(ec.created_at, ec.ended_at))):
        first = i == 0
        amounts = Amounts(
            engine_conns=int(first),
            engine_conns_failed=int(first and ec.failed),
            engine_conn_time=us,
        )
        add(ledger, UsageKey(hour, user, user_creator, engine_type, ""), amounts)
    return ledger


_DEMAND_COUNTS = {"ACCEPTED": "demands_planned", "ALLOCATED": "demands_allocated"}


def demand_usage(d: DemandTransition) -> Ledger:
    """What a demand's transition adds on the "" row of its hour."""
    user, user_creator, engine_type = _user(d.user, d.user_creator), d.user_creator, d.engine_type
    name = _DEMAND_COUNTS.get(d.to_state, "demands_failed" if d.to_state == "FAILED" else "")
    if not name:
        return {}
    key = UsageKey(hour_of(d.at), user, user_creator, engine_type, "")
    return {key: Amounts(**{name: 1})}  # type: ignore[arg-type]  # an int field by name


def add(ledger: Ledger, key: UsageKey, amounts: Amounts) -> None:
    """Add `amounts` to the row `key` of `ledger` (in memory)."""
    found = ledger.get(key)
    ledger[key] = amounts if found is None else found + amounts


def merge(ledgers: Iterable[Ledger]) -> Ledger:
    """The sum of several ledgers (summed in place per row, then frozen: the roll-up
    merges thousands of tickets' rows)."""
    counts: dict[UsageKey, list[int]] = {}
    granted: dict[UsageKey, dict[str, int]] = {}
    for ledger in ledgers:
        for key, amounts in ledger.items():
            row = counts.get(key)
            if row is None:
                counts[key] = list(_fields(amounts))
                granted[key] = dict(amounts.granted)
                continue
            for i, value in enumerate(_fields(amounts)):
                row[i] += value
            dims = granted[key]
            for dim, amount in amounts.granted.items():
                dims[dim] = dims.get(dim, 0) + amount
    return {key: Amounts(row[0], granted[key], *row[1:]) for key, row in counts.items()}


def _fields(a: Amounts) -> tuple[int, ...]:
    """The integer fields of `a` in declaration order (granted left out)."""
    return (
        a.tickets, a.measured_memory, a.measured_cpu, a.measured_granted_memory,
        a.measured_granted_cpu, a.engine_conns, a.engine_conns_failed, a.engine_conn_time,
        a.demands_planned, a.demands_allocated, a.demands_failed,
    )  # fmt: skip


@dataclass(frozen=True)
class UsageQuery:
    """A report: the ledger's hours in [since, until) summed by `group_by` (one of
    GROUPINGS), only `user`'s when set, keys after `after`, at most `limit` groups."""

    group_by: str
    since: datetime
    until: datetime
    user: str | None = None
    after: str = ""
    limit: int = 100


@dataclass(frozen=True)
class UsageGroup:
    """One group of a report, amounts in the ledger's units (x microseconds)."""

    key: str
    granted: dict[str, int]
    amounts: dict[str, int]


def efficiency(measured: float, granted: float) -> float | None:
    """measured / granted (seff's efficiency), None when nothing measured was granted."""
    return measured / granted if granted > 0 else None
