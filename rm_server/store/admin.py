"""ECM records, label limits, resource queries and the consistency check."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from rm_server.domain.admission import ECM_SOURCE, charged_part, excess_dimensions
from rm_server.domain.engineconn import Isolation
from rm_server.domain.labels import Label, LabelKey
from rm_server.domain.limits import LabelPattern, LimitRule, best_limit
from rm_server.domain.model import (
    ConsistencyReport,
    Ecm,
    LabelResource,
    Mismatch,
    Registration,
    StoredLimit,
    Ticket,
)
from rm_server.domain.resources import Resource, ResourceError, headroom
from rm_server.errors import FailedPrecondition, NotFound
from rm_server.store.codec import (
    TICKET_COLUMNS,
    at,
    jlabels,
    jres,
    opt_res,
    res,
    ticket_from_row,
)
from rm_server.store.db import LIMITS_LOCK_ID, Conn, RetryTransaction, page_filters, page_rows
from rm_server.store.ecms import node_lists
from rm_server.store.engineconns import LIVE
from rm_server.store.notify import notify_freed
from rm_server.store.tickets import key_names, load_limit_rules, lock_labels, release_all

log = logging.getLogger(__name__)

LABEL_RESOURCE_COLUMNS = (
    "label, source, max_resource, protected, used, locked, live_tickets, updated_at, reserved"
)
LABEL_RESOURCE_NAMES = tuple(c.strip() for c in LABEL_RESOURCE_COLUMNS.split(","))


def _label_resource(row: Sequence[Any]) -> LabelResource:
    """A record from its LABEL_RESOURCE_COLUMNS values (as selected, or read as JSON)."""
    label, source, maximum, protected, used, locked, live, updated, reserved = row
    return LabelResource(
        label,
        source,
        opt_res(maximum),
        res(protected),
        res(used),
        res(locked),
        live,
        at(updated),
        opt_res(reserved),
    )


async def register_ecm(
    conn: Conn,
    instance: str,
    label: str,
    labels: tuple[Label, ...],
    total: Resource,
    protected: Resource,
    now: datetime,
    include_required: bool = False,
    isolation: Isolation | None = None,
) -> Registration:
    """Create or update an ECM and its label record; a changed total is applied and logged.
    `include_required`: only ECMs the include list names may register; `isolation`: how
    its agent contains EngineConns (None: not said)."""
    if not (await node_lists(conn)).allows(instance, include_required):
        raise FailedPrecondition(
            f"ECM {instance} is not allowed by the include/exclude lists",
            state="EXCLUDED",
            reason="NODE_EXCLUDED",
        )
    rows = await lock_labels(conn, [label], now)
    row = rows.get(label)
    cur = await conn.execute(
        "SELECT total, protected, registered_at FROM ecm WHERE instance = %s FOR UPDATE",
        (instance,),
    )
    previous = await cur.fetchone()
    changed = previous is not None and (res(previous[0]) != total or res(previous[1]) != protected)
    if row is None:
        zero = Resource.zero(total.kind, total.queue)
        await conn.execute(
            "INSERT INTO label_resource (label, source, kind, max_resource, protected, used,"
            " locked, created_at, updated_at) VALUES (%s, 'ecm', %s, %s, %s, %s, %s, %s, %s)",
            (
                label,
                total.kind.value,
                jres(total),
                jres(protected),
                jres(zero),
                jres(zero),
                now,
                now,
            ),
        )
    else:
        # A record has one type: its live tickets were charged in the type it holds, and
        # are returned in it. Another type only once none is left (then from zero).
        kinds = {row.used.kind, row.locked.kind}
        if row.live_tickets and kinds != {total.kind}:
            held = "/".join(sorted(k.value for k in kinds))
            raise FailedPrecondition(
                f"ECM {instance} holds {held} for {row.live_tickets} live tickets: its resource"
                f" type cannot change to {total.kind.value} until they end",
                state="IN_USE",
                reason="ECM_IN_USE",
            )
        zero = Resource.zero(total.kind, total.queue)
        await conn.execute(
            "UPDATE label_resource SET source = 'ecm', kind = %s, max_resource = %s,"
            " protected = %s, used = CASE WHEN live_tickets = 0 THEN %s ELSE used END,"
            " locked = CASE WHEN live_tickets = 0 THEN %s ELSE locked END,"
            " updated_at = %s WHERE label = %s",
            (total.kind.value, jres(total), jres(protected), jres(zero), jres(zero), now, label),
        )
        await notify_freed(conn, [label])
    registered_at = now if previous is None else previous[2]
    await conn.execute(
        "INSERT INTO ecm (instance, label, labels, total, protected, registered_at, updated_at,"
        " isolation) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (instance) DO UPDATE SET"
        " labels = EXCLUDED.labels, total = EXCLUDED.total, protected = EXCLUDED.protected,"
        " updated_at = EXCLUDED.updated_at, isolation = EXCLUDED.isolation,"
        # A (re-)registration starts a new heartbeat sequence and revives a LOST ECM.
        " state = CASE WHEN ecm.state = 'DRAINING' THEN 'DRAINING' ELSE 'RUNNING' END,"
        " heartbeat_seq = 0, last_response = NULL, last_heartbeat_at = EXCLUDED.updated_at,"
        " beat_mark = EXCLUDED.updated_at",
        (
            instance,
            label,
            jlabels(labels),
            jres(total),
            jres(protected),
            registered_at,
            now,
            Jsonb(isolation.to_dict()) if isolation is not None else None,
        ),
    )
    if changed and previous is not None:
        log.warning(
            "ECM %s re-registered with a changed resource: total %s -> %s, protected %s -> %s",
            instance,
            previous[0],
            total.to_dict(),
            previous[1],
            protected.to_dict(),
        )
    ecm = Ecm(instance, label, labels, total, protected, registered_at, now, isolation)
    return Registration(ecm, changed)


async def unregister_ecm(
    conn: Conn, instance: str, now: datetime, why: str = "unregistered"
) -> list[str]:
    """Release every live ticket charged to the ECM, then remove its records; its history
    stays, ending with a LEFT event that says `why`."""
    cur = await conn.execute("SELECT label FROM ecm WHERE instance = %s", (instance,))
    found = await cur.fetchone()
    if found is None:
        raise NotFound(f"ECM {instance} is not registered")
    label: str = found[0]
    tickets = await _tickets_on(conn, label, lock=False)
    involved = sorted({label, *(lb for t in tickets for lb in t.charged_labels)})
    await lock_labels(conn, involved, now)
    locked_tickets = await _tickets_on(conn, label, lock=True)
    # A ticket that appeared before we held the ECM row may charge labels we have
    # not locked; locking them now would break the canonical order, so start over.
    if not {lb for t in locked_tickets for lb in t.charged_labels} <= set(involved):
        raise RetryTransaction("tickets changed while unregistering")
    released = [ticket.ticket_id for ticket in locked_tickets]
    await release_all(conn, released, now, "ECM unregistered")
    await conn.execute("DELETE FROM label_resource WHERE label = %s", (label,))
    await conn.execute("DELETE FROM ecm WHERE instance = %s", (instance,))
    await conn.execute(
        "INSERT INTO ecm_event (instance, at, state, reason) VALUES (%s, %s, 'LEFT', %s)",
        (instance, now, why),
    )
    # Its EngineConns are released above; they learn it at their next report.
    await conn.execute(
        "UPDATE engine_conn SET state = 'LOST', reason = 'ECM unregistered', ended_at = %s,"
        " updated_at = %s WHERE ecm_instance = %s AND state = ANY(%s)",
        (now, now, instance, LIVE),
    )
    await conn.execute("DELETE FROM agent_command WHERE agent_id = %s", (instance,))
    return released


async def _tickets_on(conn: Conn, label: str, *, lock: bool) -> list[Ticket]:
    sql = (
        f"SELECT {TICKET_COLUMNS} FROM ticket WHERE charged_labels @> ARRAY[%s]::text[]"  # noqa: S608
        " ORDER BY ticket_id"
    )
    cur = await conn.execute(sql + (" FOR UPDATE" if lock else ""), (label,))
    return [ticket_from_row(r) for r in await cur.fetchall()]


async def ensure_limit_rows(conn: Conn, labels: Sequence[str], now: datetime) -> int:
    """Create the records of labels that a configured limit covers (race-free)."""
    await conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (LIMITS_LOCK_ID,))
    rules = await load_limit_rules(conn, sorted({key_names(lb) for lb in labels}))
    created = 0
    for label in sorted(labels):
        rule = best_limit(LabelKey.parse(label), rules)
        if rule is None:
            continue
        zero = Resource.zero(rule.max_resource.kind, rule.max_resource.queue)
        cur = await conn.execute(
            "INSERT INTO label_resource (label, source, kind, max_resource, protected, used,"
            " locked, created_at, updated_at) VALUES (%s, 'limit', %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (label) DO NOTHING",
            (
                label,
                zero.kind.value,
                jres(rule.max_resource),
                jres(zero),
                jres(zero),
                jres(zero),
                now,
                now,
            ),
        )
        created += cur.rowcount
    return created


async def _refresh_limit_rows(conn: Conn, names: str, now: datetime) -> int:
    """Give every limit-sourced record with these key names its current best limit."""
    rules = await load_limit_rules(conn, [names])
    cur = await conn.execute(
        f"SELECT {LABEL_RESOURCE_COLUMNS} FROM label_resource"  # noqa: S608
        " WHERE source = 'limit' ORDER BY label FOR UPDATE"
    )
    affected = 0
    freed = []
    for row in map(_label_resource, await cur.fetchall()):
        if key_names(row.label) != names:
            continue
        rule = best_limit(LabelKey.parse(row.label), rules)
        new_max = None if rule is None else rule.max_resource
        if new_max == row.max_resource:
            continue
        affected += 1
        freed.append(row.label)
        if new_max is None and row.live_tickets == 0:
            await conn.execute("DELETE FROM label_resource WHERE label = %s", (row.label,))
            continue
        idle = row.live_tickets == 0 and row.reserved is None
        if new_max is not None and idle:  # it takes the limit's type
            zero = jres(Resource.zero(new_max.kind, new_max.queue))
            await conn.execute(
                "UPDATE label_resource SET max_resource = %s, kind = %s, used = %s,"
                " locked = %s, protected = %s, updated_at = %s WHERE label = %s",
                (jres(new_max), new_max.kind.value, zero, zero, zero, now, row.label),
            )
            continue
        await conn.execute(
            "UPDATE label_resource SET max_resource = %s, updated_at = %s WHERE label = %s",
            (jres(new_max), now, row.label),
        )
    await notify_freed(conn, freed)
    return affected


async def _check_limit_types(conn: Conn, names: str, rules: list[LimitRule]) -> None:
    """Refuse, before anything is written, a limit change that would give a record with
    live tickets a maximum its held type cannot be measured against (a `special` limit
    over `load` tickets): its meaning would change under them. Idle records simply take
    the new type."""
    cur = await conn.execute(
        f"SELECT {LABEL_RESOURCE_COLUMNS} FROM label_resource"  # noqa: S608
        " WHERE source = 'limit' AND (live_tickets > 0 OR reserved IS NOT NULL)"
        " ORDER BY label FOR UPDATE"
    )
    for row in map(_label_resource, await cur.fetchall()):
        if key_names(row.label) != names:
            continue
        rule = best_limit(LabelKey.parse(row.label), rules)
        if rule is None:
            continue
        try:
            held = row.protected if row.reserved is None else row.protected + row.reserved
            headroom(rule.max_resource, row.used, row.locked, held)
        except ResourceError as exc:  # the refusal itself: the limit is what is wrong
            raise FailedPrecondition(
                f"label {row.label} holds {row.locked.kind.value} for {row.live_tickets} live"
                " tickets (or a demand's reservation): a"
                f" {rule.max_resource.kind.value} limit ({rule.pattern}) cannot apply to it"
                f" until they end ({exc})",
                state="IN_USE",
                reason="LIMIT_TYPE_IN_USE",
            ) from exc


async def set_limit(
    conn: Conn, pattern: LabelPattern, max_resource: Resource, now: datetime
) -> tuple[StoredLimit, int]:
    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LIMITS_LOCK_ID,))
    names = ",".join(k for k, _ in pattern.labels)
    rules = [r for r in await load_limit_rules(conn, [names]) if r.pattern != pattern]
    await _check_limit_types(conn, names, [*rules, LimitRule(pattern, max_resource)])
    await conn.execute(
        "INSERT INTO label_limit (pattern, key_names, max_resource, created_at, updated_at)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (pattern) DO UPDATE SET"
        " max_resource = EXCLUDED.max_resource, updated_at = EXCLUDED.updated_at",
        (str(pattern), names, jres(max_resource), now, now),
    )
    affected = await _refresh_limit_rows(conn, names, now)
    return StoredLimit(str(pattern), max_resource, now), affected


async def delete_limit(conn: Conn, pattern: LabelPattern, now: datetime) -> int:
    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LIMITS_LOCK_ID,))
    names = ",".join(k for k, _ in pattern.labels)
    rules = [r for r in await load_limit_rules(conn, [names]) if r.pattern != pattern]
    await _check_limit_types(conn, names, rules)
    cur = await conn.execute(
        "DELETE FROM label_limit WHERE pattern = %s RETURNING key_names", (str(pattern),)
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no limit for {pattern}")
    return await _refresh_limit_rows(conn, row[0], now)


async def list_limits(conn: Conn, after: str, limit: int) -> list[StoredLimit]:
    cur = await conn.execute(
        "SELECT pattern, max_resource, updated_at FROM label_limit WHERE pattern > %s"
        " ORDER BY pattern LIMIT %s",
        (after, limit),
    )
    return [StoredLimit(p, res(m), u) for p, m, u in await cur.fetchall()]


async def get_label_resource(conn: Conn, label: str) -> LabelResource:
    cur = await conn.execute(
        f"SELECT {LABEL_RESOURCE_COLUMNS} FROM label_resource WHERE label = %s",  # noqa: S608
        (label,),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"label {label} has no resource record")
    return _label_resource(row)


async def list_label_resources(
    conn: Conn, after: str, limit: int, source: str
) -> list[LabelResource]:
    """A page of label records in label order after `after`, of one source if set."""
    where, values = page_filters(("label > %s", after), ("source = %s", source))
    rows = await page_rows(
        conn,
        f"SELECT {LABEL_RESOURCE_COLUMNS} FROM label_resource WHERE {where}"  # noqa: S608
        " ORDER BY label LIMIT %s",
        (*values, limit),
        "label",
    )
    return [_label_resource([r[n] for n in LABEL_RESOURCE_NAMES]) for r in rows]


async def check_consistency(conn: Conn) -> ConsistencyReport:
    """Recompute used, locked and live tickets per label from the live tickets."""
    cur = await conn.execute(f"SELECT {LABEL_RESOURCE_COLUMNS} FROM label_resource")  # noqa: S608
    records = {r[0]: r for r in await cur.fetchall()}
    cur = await conn.execute(f"SELECT {TICKET_COLUMNS} FROM ticket")  # noqa: S608
    tickets = [ticket_from_row(r) for r in await cur.fetchall()]
    used: dict[str, list[Resource]] = defaultdict(list)
    locked: dict[str, list[Resource]] = defaultdict(list)
    mismatches: list[Mismatch] = []
    for ticket in tickets:
        for label in ticket.charged_labels:
            locked[label].append(ticket.locked)
            if ticket.used is not None:
                used[label].append(ticket.used)
            if label not in records:
                mismatches.append(
                    Mismatch(
                        label, "missing_record", None, None, f"ticket {ticket.ticket_id} charges it"
                    )
                )
    over_limit: list[Mismatch] = []
    for label, raw in sorted(records.items()):
        found = _check_record(label, raw, used[label], locked[label])
        mismatches.extend(m for m in found if m.field != OVER_MAX)
        over_limit.extend(m for m in found if m.field == OVER_MAX)
    return ConsistencyReport(tuple(mismatches), len(records), len(tickets), tuple(over_limit))


# Not an inconsistency (CheckConsistencyResponse.over_limit): admission never grants past a
# maximum, so a record over it had its maximum lowered (a limit, an ECM's re-registration).
OVER_MAX = "over_max"


def _check_record(
    label: str, raw: tuple[Any, ...], used: list[Resource], locked: list[Resource]
) -> list[Mismatch]:
    # A consistency check reports what it finds, it does not stop at it: an invalid
    # record or a ticket that does not fit it is a mismatch, the others are still checked.
    try:
        row = _label_resource(raw)
    except ResourceError as exc:
        return [Mismatch(label, "negative", None, None, f"stored record is invalid: {exc}")]
    out = []
    for field, stored, parts in (("used", row.used, used), ("locked", row.locked, locked)):
        expected = Resource.zero(stored.kind, stored.queue)
        try:
            for part in parts:
                expected = expected + charged_part(row.source, row.max_resource, part)
        except ResourceError as exc:
            out.append(Mismatch(label, field, stored, None, f"a live ticket does not fit: {exc}"))
            continue
        ecm_kind = row.max_resource.kind if row.max_resource is not None else stored.kind
        if row.source == ECM_SOURCE and stored.kind is not ecm_kind:
            out.append(
                Mismatch(label, "kind", stored, None, f"an ECM's record holds {ecm_kind.value}")
            )
        if not (stored.ge(expected) and expected.ge(stored)):
            out.append(Mismatch(label, field, stored, expected, "stored != sum of live tickets"))
    count = sum(1 for _ in locked)
    if row.live_tickets != count:
        out.append(
            Mismatch(
                label,
                "live_tickets",
                None,
                None,
                f"stored {row.live_tickets}, live tickets {count}",
            )
        )
    if row.max_resource is not None:
        in_use = row.used + row.locked + row.protected
        excess = excess_dimensions(row.max_resource, in_use)
        if excess:
            out.append(
                Mismatch(
                    label,
                    OVER_MAX,
                    in_use,
                    row.max_resource,
                    "over its limit after a change: used + locked + protected exceeds the"
                    " maximum in " + ", ".join(excess) + "; nothing more is granted there,"
                    " and it drains as tickets end",
                )
            )
    return out
