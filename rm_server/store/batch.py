"""Apply, ReportUsed and Release of many requests in one transaction.

Concurrent requests are grouped (rm_server/batching.py) and run here, in arrival
order, as if each ran alone one after the other:

1. one round trip (pipelined: BEGIN and one statement, READ): the outcomes already
   logged for these request ids; every label row the group touches, locked in
   canonical order (the labels the Apply requests name and those the ReportUsed /
   Release tickets are charged to), with the live waiters queued on each; then the
   live tickets, locked;
2. in memory, request by request in arrival order, the same decisions as the
   one-request path (tickets.decide_apply / decide_report / decide_end): a request
   sees the rows as the requests before it left them, so each is all-or-nothing,
   waiters keep their FIFO order, and a refusal or an error of one request changes
   nothing for it and nothing for the others (its effects are rolled back in memory);
3. one round trip (pipelined: one statement, WRITE, and COMMIT): the changed rows,
   the new, changed and ended tickets, their history, the outcome of every request in
   request_log (so a retry replays it), the waiters served, the notifications.

A request id that another transaction committed meanwhile makes the request_log
INSERT fail: the whole group is retried, and that request then replays the stored
outcome. A group of one is the one-request path of the server (pgbench runs the same
statements: bench/pgbench/cycle.sql).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from rm_server.domain.labels import Label, LabelKey
from rm_server.domain.limits import best_limit
from rm_server.domain.model import Refusal, Ticket, TicketState
from rm_server.domain.resources import Resource
from rm_server.errors import InvalidArgument, LabelrmError, NotFound, ResourceExhausted
from rm_server.store.codec import (
    HISTORY_COLUMNS,
    TICKET_COLUMNS,
    ticket_from_history,
)
from rm_server.store.db import (
    Conn,
    Idempotency,
    OutcomeEncoder,
    Replay,
    RetryTransaction,
    is_final,
)
from rm_server.store.notify import CHANNEL
from rm_server.store.tickets import (
    ECM_STATE,
    LABEL_COLUMNS,
    NO_WAITER,
    WRITE_LABELS,
    ApplyCommand,
    LabelRow,
    NeedLimitRows,
    decide_apply,
    decide_end,
    decide_report,
    key_names,
    label_row,
    labels_json,
    load_limit_rules,
    lock_expired,
    lock_expired_error,
    not_live_error,
)

Outcome = Ticket | Replay | BaseException


def refusal_error(refusal: Refusal) -> ResourceExhausted:
    if refusal.shortfalls:
        return ResourceExhausted("insufficient resource", refusal.shortfalls)
    return ResourceExhausted(
        "queued behind earlier waiting applies on " + ", ".join(refusal.queued_behind),
        reason="QUEUED_BEHIND_WAITERS",
    )


@dataclass(eq=False)
class Op:
    idem: Idempotency
    encoder: OutcomeEncoder[Ticket]

    @property
    def key(self) -> tuple[str, str]:
        return (self.idem.method, self.idem.request_id)


@dataclass(eq=False)
class ApplyOp(Op):
    ticket_id: str
    user: str
    labels: tuple[Label, ...]
    keys: tuple[str, ...]  # canonical order
    resource: Resource
    lock_timeout: timedelta
    waiter_seq: int | None = None
    may_wait: bool = False

    def command(self, now: datetime) -> ApplyCommand:
        return ApplyCommand(
            ticket_id=self.ticket_id,
            user=self.user,
            labels=self.labels,
            keys=self.keys,
            resource=self.resource,
            now=now,
            lock_expires_at=now + self.lock_timeout,
            waiter_seq=self.waiter_seq,
            may_wait=self.may_wait,
        )


@dataclass(eq=False)
class ReportOp(Op):
    ticket_id: str
    used: Resource | None


@dataclass(eq=False)
class ReleaseOp(Op):
    ticket_id: str
    reason: str = "released"


# ----- SQL (one statement each, whatever the number of requests) ---------------------------

LABEL_NAMES = tuple(c.strip().removeprefix("r.") for c in LABEL_COLUMNS.split(","))

# Round trip 1, one statement: the outcomes already logged for these request ids; the
# labels named by Apply requests plus those the tickets are charged to (charged labels
# never change, so peeking at them in the same statement is safe), locked in canonical
# order, each with its live waiters in queue order; then the live tickets, locked (the
# select list is evaluated left to right: labels before tickets, as everywhere).
READ = (
    "SELECT"  # noqa: S608 - constant column lists
    " (SELECT coalesce(json_agg(g), '[]') FROM ("
    "   SELECT method, request_id, request_hash, status_code, response FROM request_log"
    "   WHERE method = ANY(%s) AND request_id = ANY(%s)) g),"
    " (SELECT coalesce(json_agg(x), '[]') FROM ("
    f"   SELECT {LABEL_COLUMNS}, {ECM_STATE},"
    "    ARRAY(SELECT w.seq FROM apply_waiter w WHERE w.label = r.label"
    "          AND w.expires_at > %s ORDER BY w.seq) AS waiters"
    "   FROM label_resource r WHERE r.label = ANY(%s::text[] || ARRAY("
    "     SELECT unnest(t.charged_labels) FROM ticket t WHERE t.ticket_id = ANY(%s::text[])))"
    "   ORDER BY r.label FOR UPDATE OF r) x),"
    " (SELECT coalesce(json_agg(k), '[]') FROM ("
    f"   SELECT {TICKET_COLUMNS} FROM ticket WHERE ticket_id = ANY(%s)"
    "   ORDER BY ticket_id FOR UPDATE) k)"
)
SELECT_HISTORY = f"SELECT {HISTORY_COLUMNS} FROM ticket_history WHERE ticket_id = ANY(%s)"  # noqa: S608
EXISTING_LABELS = "SELECT label FROM label_resource WHERE label = ANY(%s)"
INSERT_TICKETS = (
    f"INSERT INTO ticket ({TICKET_COLUMNS}) SELECT {TICKET_COLUMNS}"  # noqa: S608
    " FROM json_to_recordset(%s::json) AS x(ticket_id text, state text, user_name text,"
    " labels jsonb, charged_labels text[], requested jsonb, locked jsonb, used jsonb,"
    " created_at timestamptz, updated_at timestamptz, lock_expires_at timestamptz)"
)
UPDATE_TICKETS = (
    "UPDATE ticket t SET state = x.state, used = x.used, locked = x.locked,"
    " lock_expires_at = x.lock_expires_at, updated_at = x.updated_at"
    " FROM json_to_recordset(%s::json) AS x(ticket_id text, state text, used jsonb,"
    " locked jsonb, lock_expires_at timestamptz, updated_at timestamptz)"
    " WHERE t.ticket_id = x.ticket_id"
)
DELETE_TICKETS = "DELETE FROM ticket WHERE ticket_id = ANY(%s)"
INSERT_HISTORY = (
    f"INSERT INTO ticket_history ({HISTORY_COLUMNS}) SELECT {HISTORY_COLUMNS}"  # noqa: S608
    " FROM json_to_recordset(%s::json) AS x(ticket_id text, final_state text, reason text,"
    " user_name text, labels jsonb, charged_labels text[], requested jsonb, used jsonb,"
    " created_at timestamptz, reported_at timestamptz, ended_at timestamptz)"
)
INSERT_LOG = (
    "INSERT INTO request_log (method, request_id, request_hash, status_code, response,"
    " created_at) SELECT method, request_id, request_hash, status_code, response, %s"
    " FROM json_to_recordset(%s::json) AS x(method text, request_id text,"
    " request_hash bytea, status_code int, response bytea)"
)
DELETE_WAITERS = "DELETE FROM apply_waiter WHERE seq = ANY(%s)"
# Round trip 2, one statement (then COMMIT): every write of the group. Each row is
# written by one part only (a ticket is inserted, updated or deleted, by its final
# state), as data-modifying WITH parts all see the same snapshot. A request id that
# another transaction committed meanwhile fails the request_log INSERT: retried.
WRITE = (
    f"WITH l AS ({WRITE_LABELS}), ti AS ({INSERT_TICKETS}), tu AS ({UPDATE_TICKETS}),"  # noqa: S608
    f" td AS ({DELETE_TICKETS}), th AS ({INSERT_HISTORY}), rl AS ({INSERT_LOG}),"
    f" wd AS ({DELETE_WAITERS})"
    " SELECT count(pg_notify(%s, x)) FROM unnest(%s::text[]) AS x"
)


# ----- the state of one group, in memory ---------------------------------------------------


_MISSING = object()


@dataclass
class _State:
    """The rows and tickets as the requests so far left them. Every change goes through
    put() / notify_on(), which keep an undo log, so that a request that fails without
    an answer to store is rolled back in memory (cost: its own changes, not the group's)."""

    rows: dict[str, LabelRow]
    waiters: dict[str, tuple[int, ...]]
    tickets: dict[str, Ticket | None]  # live tickets; None once ended in this group
    ended: dict[str, Ticket] = field(default_factory=dict)  # ended in this group
    history: list[tuple[Ticket, Ticket]] = field(default_factory=list)  # (live, ended)
    waiters_served: list[int] = field(default_factory=list)
    notify: set[str] = field(default_factory=set)
    _undo: list[tuple[Any, Any, Any]] = field(default_factory=list)

    def put(self, mapping: dict[Any, Any], key: Any, value: Any) -> None:
        self._undo.append((mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def notify_on(self, labels: Sequence[str]) -> None:
        for label in labels:
            if label not in self.notify:
                self._undo.append((self.notify, label, _MISSING))
                self.notify.add(label)

    def snapshot(self) -> tuple[int, int, int]:
        return len(self._undo), len(self.history), len(self.waiters_served)

    def restore(self, snap: tuple[int, int, int]) -> None:
        mark, nh, nw = snap
        while len(self._undo) > mark:
            target, key, old = self._undo.pop()
            if target is self.notify:
                self.notify.discard(key)
            elif old is _MISSING:
                del target[key]
            else:
                target[key] = old
        del self.history[nh:]
        del self.waiters_served[nw:]

    def end(self, ticket: Ticket, now: datetime, state: TicketState, reason: str) -> Ticket:
        updated, ended = decide_end(ticket, self.rows, now, state, reason)
        for row in updated:
            self.put(self.rows, row.label, row)
        self.put(self.tickets, ticket.ticket_id, None)
        self.put(self.ended, ticket.ticket_id, ended)
        self.history.append((ticket, ended))
        self.notify_on([r.label for r in updated])
        return ended


def _bytea(value: str) -> bytes:
    """A bytea as PostgreSQL writes it in JSON: "\\x" and hex digits."""
    return bytes.fromhex(value[2:])


def _at(value: str) -> datetime:
    """A timestamptz as PostgreSQL writes it in JSON."""
    return datetime.fromisoformat(value).astimezone(UTC)


def _time(value: str | None) -> datetime | None:
    return None if value is None else _at(value)


_LABELS: dict[tuple[str, str], Label] = {}


def _label(key: str, value: str) -> Label:
    """Labels read back from tickets, validated once per process (a bounded cache)."""
    label = _LABELS.get((key, value))
    if label is None:
        if len(_LABELS) >= 65536:
            _LABELS.clear()
        label = _LABELS[(key, value)] = Label(key, value)
    return label


def _ticket(obj: dict[str, Any]) -> Ticket:
    """A live ticket from its row as JSON (the columns of TICKET_COLUMNS)."""
    state = TicketState(obj["state"])
    return Ticket(
        ticket_id=obj["ticket_id"],
        state=state,
        user=obj["user_name"],
        labels=tuple(_label(str(k), str(v)) for k, v in obj["labels"]),
        charged_labels=tuple(obj["charged_labels"]),
        requested=Resource.from_dict(obj["requested"]),
        locked=Resource.from_dict(obj["locked"]),
        used=Resource.from_dict(obj["used"]) if state is TicketState.USED else None,
        created_at=_at(obj["created_at"]),
        updated_at=_at(obj["updated_at"]),
        lock_expires_at=_time(obj["lock_expires_at"]),
    )


def _json_time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _labels_json(labels: tuple[Label, ...]) -> list[list[str]]:
    return [[label.key, label.value] for label in labels]


# ----- the group transaction ---------------------------------------------------------------


async def run(conn: Conn, ops: Sequence[Op], now: datetime) -> list[Outcome]:
    """Run `ops` in arrival order in the caller's (pipelined) transaction; returns one
    outcome per op: the result, the replay of an earlier call, or the exception."""
    applies = [op for op in ops if isinstance(op, ApplyOp)]
    ticket_ids = sorted({op.ticket_id for op in ops if isinstance(op, ReportOp | ReleaseOp)})
    apply_labels = sorted({k for op in applies for k in op.keys})

    # Round trip 1: what was already done, then the locks (labels, then tickets).
    cur = await conn.execute(
        READ,
        (
            sorted({op.idem.method for op in ops}),
            sorted({op.idem.request_id for op in ops}),
            now,
            apply_labels,
            ticket_ids,
            ticket_ids,
        ),
    )
    found = await cur.fetchone()
    assert found is not None
    logged_json, rows_json, tickets_json = found
    logged = {
        (g["method"], g["request_id"]): (
            _bytea(g["request_hash"]),
            g["status_code"],
            _bytea(g["response"] or "\\x"),
        )
        for g in logged_json
    }
    rows = {
        x["label"]: label_row([x[n] for n in LABEL_NAMES], False, x["ecm_state"]) for x in rows_json
    }
    waiters = {x["label"]: tuple(x["waiters"]) for x in rows_json if x["waiters"]}
    live = [_ticket(k) for k in tickets_json]
    initial_rows = dict(rows)
    initial_tickets = {t.ticket_id: t for t in live}

    # Rarely needed: a locked ticket whose charged label has no locked row must have lost
    # its record (ECM unregistered); otherwise the ticket appeared after the peek: retry.
    unlocked = sorted({lb for t in live for lb in t.charged_labels if lb not in rows})
    if unlocked:
        cur = await conn.execute(EXISTING_LABELS, (unlocked,))
        if await cur.fetchall():
            raise RetryTransaction("a ticket appeared between peek and lock")
    # Labels without a record: the ones with a configured limit need one first.
    missing = sorted({k for k in apply_labels if k not in rows})
    need: set[str] = set()
    if missing:
        rules = await load_limit_rules(conn, sorted({key_names(m) for m in missing}))
        need = {m for m in missing if best_limit(LabelKey.parse(m), rules) is not None}
    # Tickets that are not live: their history answers Release and explains ReportUsed.
    gone = [t for t in ticket_ids if t not in initial_tickets]
    history: dict[str, Ticket] = {}
    if gone:
        cur = await conn.execute(SELECT_HISTORY, (gone,))
        history = {t.ticket_id: t for t in map(ticket_from_history, await cur.fetchall())}

    state = _State(rows, waiters, dict(initial_tickets))
    outcomes: list[Outcome] = []
    log_rows: list[tuple[Op, int, bytes]] = []
    for op in ops:
        earlier = logged.get(op.key)
        if earlier is not None:
            outcomes.append(_replay(op, earlier))
            continue
        snap = state.snapshot()
        try:
            result = _execute(op, state, now, need, history)
        except Exception as exc:
            if is_final(exc):  # the answer to the request: stored, effects kept
                assert isinstance(exc, LabelrmError)
                code, payload = op.encoder.error(exc)
                log_rows.append((op, code, payload))
                outcomes.append(exc)
                continue
            # Not a final answer (bad input, a transient refusal, must wait, ...): undone.
            state.restore(snap)
            outcomes.append(exc)
            continue
        log_rows.append((op, 0, op.encoder.ok(result)))
        outcomes.append(result)

    # Round trip 2: every write, then COMMIT (on leaving the caller's transaction).
    changed = [row for label, row in state.rows.items() if row is not initial_rows[label]]
    inserted = [
        t for tid, t in state.tickets.items() if t is not None and tid not in initial_tickets
    ]
    updated = [
        t
        for tid, t in state.tickets.items()
        if t is not None and tid in initial_tickets and t is not initial_tickets[tid]
    ]
    deleted = [tid for tid, t in state.tickets.items() if t is None and tid in initial_tickets]
    if changed or inserted or updated or deleted or state.history or log_rows:
        await conn.execute(
            WRITE,
            (
                now,
                labels_json(changed),
                json.dumps([_ticket_json(t) for t in inserted]),
                json.dumps([_update_json(t) for t in updated]),
                deleted,
                json.dumps([_history_json(a, b) for a, b in state.history]),
                now,
                json.dumps(
                    [
                        {
                            "method": op.idem.method,
                            "request_id": op.idem.request_id,
                            "request_hash": "\\x" + op.idem.request_hash.hex(),
                            "status_code": code,
                            "response": "\\x" + payload.hex(),
                        }
                        for op, code, payload in log_rows
                    ]
                ),
                state.waiters_served,
                CHANNEL,
                sorted(state.notify),
            ),
        )
    return outcomes


def _replay(op: Op, found: tuple[bytes, int | None, Any]) -> Outcome:
    request_hash, code, response = found
    if request_hash != op.idem.request_hash:
        return InvalidArgument(
            "request_id", "reused with a different request", reason="REQUEST_ID_REUSED"
        )
    assert code is not None  # outcomes are committed with their request id
    return Replay(status_code=code, response=response)


def _execute(
    op: Op, state: _State, now: datetime, need: set[str], history: dict[str, Ticket]
) -> Ticket:
    if isinstance(op, ApplyOp):
        return _apply(op, state, now, need)
    assert isinstance(op, ReportOp | ReleaseOp)
    ticket = state.tickets.get(op.ticket_id)
    if isinstance(op, ReleaseOp):
        if ticket is None:
            ended = state.ended.get(op.ticket_id) or history.get(op.ticket_id)
            if ended is None:
                raise NotFound(f"ticket {op.ticket_id} not found")
            return ended
        return state.end(ticket, now, TicketState.RELEASED, op.reason)
    if ticket is None:
        ended = state.ended.get(op.ticket_id) or history.get(op.ticket_id)
        raise not_live_error(op.ticket_id, ended)
    if lock_expired(ticket, now):
        state.end(ticket, now, TicketState.EXPIRED, "lock timeout")
        raise lock_expired_error(op.ticket_id)
    updated, reported, freed = decide_report(ticket, state.rows, op.used, now)
    for row in updated:
        state.put(state.rows, row.label, row)
    state.put(state.tickets, op.ticket_id, reported)
    if freed:
        state.notify_on([r.label for r in updated])
    return reported


def _apply(op: ApplyOp, state: _State, now: datetime, need: set[str]) -> Ticket:
    needed = [k for k in op.keys if k in need]
    if needed:
        raise NeedLimitRows(needed)
    seq = NO_WAITER if op.waiter_seq is None else op.waiter_seq
    rows = state.rows
    if state.waiters and any(k in state.waiters for k in op.keys):
        rows = {
            k: replace(row, queued=any(w < seq for w in state.waiters.get(k, ())))
            for k in op.keys
            if (row := state.rows.get(k)) is not None
        }
    outcome = decide_apply(op.command(now), rows)
    if isinstance(outcome, Refusal):
        raise refusal_error(outcome)
    charged, ticket = outcome
    for row in charged:
        state.put(state.rows, row.label, replace(row, queued=False) if row.queued else row)
    state.put(state.tickets, ticket.ticket_id, ticket)
    if op.waiter_seq is not None:
        for k in op.keys:
            if k in state.waiters:
                left = tuple(w for w in state.waiters[k] if w != op.waiter_seq)
                state.put(state.waiters, k, left)
        state.waiters_served.append(op.waiter_seq)
    return ticket


def _ticket_json(t: Ticket) -> dict[str, Any]:
    used = t.used if t.used is not None else Resource.zero(t.requested.kind, t.requested.queue)
    return {
        "ticket_id": t.ticket_id,
        "state": t.state.value,
        "user_name": t.user,
        "labels": _labels_json(t.labels),
        "charged_labels": list(t.charged_labels),
        "requested": t.requested.to_dict(),
        "locked": t.locked.to_dict(),
        "used": used.to_dict(),
        "created_at": _json_time(t.created_at),
        "updated_at": _json_time(t.updated_at),
        "lock_expires_at": _json_time(t.lock_expires_at),
    }


def _update_json(t: Ticket) -> dict[str, Any]:
    used = t.used if t.used is not None else Resource.zero(t.requested.kind, t.requested.queue)
    return {
        "ticket_id": t.ticket_id,
        "state": t.state.value,
        "used": used.to_dict(),
        "locked": t.locked.to_dict(),
        "lock_expires_at": _json_time(t.lock_expires_at),
        "updated_at": _json_time(t.updated_at),
    }


def _history_json(live: Ticket, ended: Ticket) -> dict[str, Any]:
    return {
        "ticket_id": live.ticket_id,
        "final_state": ended.state.value,
        "reason": ended.end_reason,
        "user_name": live.user,
        "labels": _labels_json(live.labels),
        "charged_labels": list(live.charged_labels),
        "requested": live.requested.to_dict(),
        "used": None if live.used is None else live.used.to_dict(),
        "created_at": _json_time(live.created_at),
        "reported_at": _json_time(live.updated_at if live.used is not None else None),
        "ended_at": _json_time(ended.ended_at),
    }
