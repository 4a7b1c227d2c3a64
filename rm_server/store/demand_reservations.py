"""A demand's hold on capacity in SQL: its reservation on its labels' records while
ALLOCATING, and the hand-over of that reservation to a ticket (the demand's rows,
transitions and plan: rm_server/store/demands.py). Lock order as there: label rows in
canonical order (through ``tickets.lock_labels``), then the ticket row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from rm_server.domain import ledger
from rm_server.domain.demands.model import Demand
from rm_server.domain.errors import DomainError
from rm_server.domain.ledger import LabelAccount
from rm_server.domain.model import Refusal, Ticket
from rm_server.domain.resources import Resource
from rm_server.errors import as_rm_error
from rm_server.store import admin as admin_store
from rm_server.store import tickets as ticket_store
from rm_server.store.codec import LABEL_COLUMNS, account_from_row, jres, opt_res, res
from rm_server.store.db import Conn
from rm_server.store.notify import notify_freed


async def reserve(conn: Conn, d: Demand, now: datetime) -> tuple[str, ...]:
    """Add the demand's resource to ``reserved`` on each of its labels with a maximum;
    returns those labels. InvalidArgument when the resource does not fit a label's kind."""
    await admin_store.ensure_limit_rows(conn, d.charged_labels, now)
    rows = await ticket_store.lock_labels(conn, d.charged_labels, now)
    done = []
    for label in d.charged_labels:
        row = rows.get(label)
        if row is None or row.max_resource is None:
            continue
        try:
            held = ledger.reserve(row, d.resource).reserved  # an ECM's record: its part only
        except DomainError as exc:  # the resource does not match the label
            raise as_rm_error(exc) or exc from None
        await conn.execute(
            "UPDATE label_resource SET reserved = %s WHERE label = %s", (jres(held), label)
        )
        done.append(label)
    return tuple(done)


async def unreserve(conn: Conn, d: Demand, now: datetime, *, handover: bool = False) -> None:
    """Take the demand's reservation off its labels. Freed capacity wakes waiting applies,
    except on a handover (the same capacity goes to the demand's ticket at once)."""
    if not d.reserved_labels:
        return
    rows = await ticket_store.lock_labels(conn, d.charged_labels, now)  # canonical superset
    for label in d.reserved_labels:
        row = rows.get(label)
        if row is None or row.reserved is None:  # the record was removed meanwhile
            continue
        left = ledger.unreserve(row, d.resource)
        value = None if left is None else jres(left)
        await conn.execute(
            "UPDATE label_resource SET reserved = %s WHERE label = %s", (value, label)
        )
    if not handover:
        await notify_freed(conn, d.reserved_labels)


async def lock_labels(conn: Conn, labels: Sequence[str], now: datetime) -> tuple[LabelAccount, ...]:
    """Lock the label rows an allocation will charge (creating the ones a limit covers),
    in canonical order, so that the allocation can be decided once they are held.

    Returns what decides whether an allocation fits: the records, in canonical order
    (``ledger.more_room`` tells whether an allocation refused under them may fit later)."""
    cur = await conn.execute(
        "SELECT count(*) FROM label_resource WHERE label = ANY(%s)", (list(labels),)
    )
    row = await cur.fetchone()
    if row is None or row[0] < len(set(labels)):  # some record is still to be created
        await admin_store.ensure_limit_rows(conn, labels, now)
    return capacity_of(await ticket_store.lock_labels(conn, labels, now), labels)


def capacity_of(
    records: Mapping[str, LabelAccount], labels: Sequence[str]
) -> tuple[LabelAccount, ...]:
    """What decides whether an allocation on ``labels`` fits: the records of them that
    exist, in canonical order (from ``lock_labels`` or ``read_capacities``)."""
    return tuple(records[label] for label in sorted(set(labels)) if label in records)


async def read_capacities(conn: Conn, labels: Sequence[str]) -> dict[str, LabelAccount]:
    """The records of ``labels`` (for ``capacity_of``), read without locking them."""
    cur = await conn.execute(
        f"SELECT {LABEL_COLUMNS} FROM label_resource r WHERE r.label = ANY(%s)",  # noqa: S608
        (list(labels),),
    )
    return {row[0]: account_from_row(row) for row in await cur.fetchall()}


class _Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__("refused")
        self.refusal = refusal


async def allocate(conn: Conn, d: Demand, cmd: ticket_store.ApplyCommand) -> Ticket | Refusal:
    """Hand the reservation over to a ticket through the normal Apply path, atomically.

    Inside a savepoint: the reservation is taken off, then ``tickets.apply`` locks every
    label, checks every one and charges all or none. A refusal rolls the savepoint back,
    so the reservation stands as it was and the demand is passed over this round.
    """
    try:
        async with conn.transaction():  # a savepoint in the caller's transaction
            # The label rows were created (lock_labels) before they were locked: creating
            # them here would take the limits' lock after the rows, where a limit change
            # takes it before them (a deadlock). A limit that appeared since: NeedsRows.
            await ticket_store.lock_labels(conn, cmd.keys, cmd.now)  # every key, canonical
            await unreserve(conn, d, cmd.now, handover=True)
            outcome = await ticket_store.apply(conn, cmd)
            if isinstance(outcome, ticket_store.NeedsRows):  # a limit appeared: next round
                raise _Refused(Refusal((), outcome.labels))
            if isinstance(outcome, Refusal):
                raise _Refused(outcome)
            return outcome
    except _Refused as refused:
        return refused.refusal


async def check_reservations(conn: Conn) -> list[str]:
    """Every label whose ``reserved`` differs from the sum of its ALLOCATING demands'
    reservations (empty when consistent); for tests and operators."""
    cur = await conn.execute(
        "SELECT d.resource, l FROM demand d, unnest(d.reserved_labels) AS l"
        " WHERE d.state = 'ALLOCATING'"
    )
    expected: dict[str, Resource] = {}
    for resource, label in await cur.fetchall():
        r = res(resource)
        expected[label] = r if label not in expected else expected[label] + r
    cur = await conn.execute("SELECT label, reserved FROM label_resource")
    problems = []
    for label, reserved in await cur.fetchall():
        stored = opt_res(reserved)
        want = expected.pop(label, None)
        if (stored is None or stored.is_zero()) and (want is None or want.is_zero()):
            continue
        if stored != want:
            problems.append(f"{label}: reserved {stored}, expected {want}")
    problems.extend(f"{label}: no record for a reservation of {r}" for label, r in expected.items())
    return problems
