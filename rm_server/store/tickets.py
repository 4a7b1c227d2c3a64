"""Apply, ReportUsed, Release and lock expiry: one path for one request or many.

`run(conn, ops, now)` runs a group of requests (rm_server/app/batching.py groups
concurrent ones; a group of one is the single request) in the caller's transaction,
in arrival order, as if each ran alone one after the other:

1. READ, one statement: the outcomes already logged for the ops' request ids; every
   label row the group touches, locked in canonical order (the labels the Apply
   requests name and those the tickets are charged to), with the live waiters queued
   on each; then the live tickets, locked;
2. in memory, request by request, the ledger's rules (rm_server/domain/ledger.py): a
   request sees the accounts as the requests before it left them, so each is
   all-or-nothing, waiters keep their FIFO order, and a refusal or an error of one
   request changes nothing for it and nothing for the others (its effects are rolled
   back in memory);
3. WRITE, one statement: the changed accounts, the new, changed and ended tickets,
   their history, the outcome of every request in request_log (so a retry replays
   it), the waiters served, the notifications. Each row type has one encoder
   (rm_server/store/codec.py).

A request id that another transaction committed meanwhile makes the request_log
INSERT fail: the whole group is retried, and that request then replays the stored
outcome. Ops without a request id (the EngineConn, agent, demand and ECM flows, which
run them inside their own transactions) are not logged. pgbench runs the same
statements: bench/pgbench/cycle.sql.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rm_server.domain.labels import LabelKey
from rm_server.domain.ledger import (
    ApplyCommand,
    LabelAccount,
    Waiter,
    check_accounts,
    check_user_may_end,
    decide_apply,
    decide_end,
    decide_report,
    held_back,
    lock_expired,
    lock_expired_error,
    not_live_error,
)
from rm_server.domain.limits import LabelPattern, LimitRule, best_limit
from rm_server.domain.model import Refusal, Ticket, TicketState
from rm_server.domain.resources import Resource
from rm_server.errors import InvalidArgument, LabelrmError, not_found
from rm_server.store.codec import (
    ECM_STATE,
    HISTORY_COLUMNS,
    LABEL_COLUMNS,
    LABEL_NAMES,
    TICKET_COLUMNS,
    account_from_row,
    accounts_json,
    history_json,
    res,
    ticket_from_history,
    ticket_from_json,
    ticket_json,
    waiter_from_json,
)
from rm_server.store.db import (
    Conn,
    Idempotency,
    Replay,
    RetryTransaction,
    is_final,
)
from rm_server.store.notify import CHANNEL
from rm_server.store.ticket_ops import (
    ApplyOp,
    ExpireOp,
    MustWait,
    NeedLimitRows,
    Op,
    Refused,
    ReleaseOp,
    ReportOp,
)
from rm_server.store.waiters import locked_waiters

__all__ = ["ApplyCommand", "LabelAccount", "check_accounts", "run"]

NO_WAITER = 2**63 - 1  # a new request ranks after every registered waiter

Outcome = Ticket | Replay | BaseException | None

_TICKET_OPS = ReportOp | ReleaseOp | ExpireOp

# ----- SQL (one statement each, whatever the number of requests) -----------------------------

# READ: the outcomes already logged for these request ids; the labels named by Apply
# requests plus those the tickets are charged to (charged labels never change, so
# peeking at them in the same statement is safe), locked in canonical order, each with
# its live waiters in queue order; then the live tickets, locked (the select list is
# evaluated left to right: labels before tickets, as everywhere).
READ = (
    "SELECT"  # noqa: S608 - constant column lists
    " (SELECT coalesce(json_agg(g), '[]') FROM ("
    "   SELECT caller, method, request_id, request_hash, status_code, response"
    "   FROM request_log WHERE caller = ANY(%(callers)s) AND method = ANY(%(methods)s)"
    "   AND request_id = ANY(%(request_ids)s)) g),"
    " (SELECT coalesce(json_agg(x), '[]') FROM ("
    f"   SELECT {LABEL_COLUMNS}, {ECM_STATE},"
    "    (SELECT coalesce(json_agg(json_build_array(w.seq, w.user_name, w.resource,"
    "       w.hold_until) ORDER BY w.seq), '[]') FROM apply_waiter w"
    "     WHERE w.label = r.label AND w.expires_at > %(now)s) AS waiters"
    "   FROM label_resource r WHERE r.label = ANY(%(apply_labels)s::text[] || ARRAY("
    "     SELECT unnest(t.charged_labels) FROM ticket t"
    "     WHERE t.ticket_id = ANY(%(ticket_ids)s::text[])))"
    "   ORDER BY r.label FOR UPDATE OF r) x),"
    " (SELECT coalesce(json_agg(k), '[]') FROM ("
    f"   SELECT {TICKET_COLUMNS} FROM ticket WHERE ticket_id = ANY(%(ticket_ids)s)"
    "   ORDER BY ticket_id FOR UPDATE) k)"
)
SELECT_HISTORY = f"SELECT {HISTORY_COLUMNS} FROM ticket_history WHERE ticket_id = ANY(%s)"  # noqa: S608
EXISTING_LABELS = "SELECT label FROM label_resource WHERE label = ANY(%s)"
WRITE_LABELS = (
    "UPDATE label_resource r SET used = u.used, locked = u.locked, kind = u.kind,"
    " live_tickets = u.live, updated_at = %(now)s"
    " FROM json_to_recordset(%(labels)s::json)"
    "   AS u(label text, used jsonb, locked jsonb, kind text, live bigint)"
    " WHERE r.label = u.label"
)
INSERT_TICKETS = (
    f"INSERT INTO ticket ({TICKET_COLUMNS}) SELECT {TICKET_COLUMNS}"  # noqa: S608
    " FROM json_to_recordset(%(inserted)s::json) AS x(ticket_id text, state text, user_name text,"
    " labels jsonb, charged_labels text[], requested jsonb, locked jsonb, used jsonb,"
    " created_at timestamptz, updated_at timestamptz, lock_expires_at timestamptz,"
    " engine_conn_id text)"
)
UPDATE_TICKETS = (
    "UPDATE ticket t SET state = x.state, used = x.used, locked = x.locked,"
    " lock_expires_at = x.lock_expires_at, updated_at = x.updated_at"
    " FROM json_to_recordset(%(updated)s::json) AS x(ticket_id text, state text, used jsonb,"
    " locked jsonb, lock_expires_at timestamptz, updated_at timestamptz)"
    " WHERE t.ticket_id = x.ticket_id"
)
DELETE_TICKETS = "DELETE FROM ticket WHERE ticket_id = ANY(%(deleted)s)"
INSERT_HISTORY = (
    f"INSERT INTO ticket_history ({HISTORY_COLUMNS}) SELECT {HISTORY_COLUMNS}"  # noqa: S608
    " FROM json_to_recordset(%(history)s::json) AS x(ticket_id text, final_state text, reason text,"
    " user_name text, labels jsonb, charged_labels text[], requested jsonb, used jsonb,"
    " created_at timestamptz, reported_at timestamptz, ended_at timestamptz)"
)
INSERT_LOG = (
    "INSERT INTO request_log (caller, method, request_id, request_hash, status_code,"
    " response, created_at)"
    " SELECT caller, method, request_id, request_hash, status_code, response, %(now)s"
    " FROM json_to_recordset(%(log)s::json) AS x(caller text, method text, request_id text,"
    " request_hash bytea, status_code int, response bytea)"
)
DELETE_WAITERS = (
    f"DELETE FROM apply_waiter w USING ({locked_waiters('seq = ANY(%(waiters)s)')}) k"  # noqa: S608
    " WHERE w.label = k.label AND w.seq = k.seq"
)
# WRITE, one statement: every write of the group. Each row is written by one part only
# (a ticket is inserted, updated or deleted, by its final state), as data-modifying
# WITH parts all see the same snapshot. A request id that another transaction
# committed meanwhile fails the request_log INSERT: retried.
WRITE = (
    f"WITH l AS ({WRITE_LABELS}), ti AS ({INSERT_TICKETS}), tu AS ({UPDATE_TICKETS}),"  # noqa: S608
    f" td AS ({DELETE_TICKETS}), th AS ({INSERT_HISTORY}), rl AS ({INSERT_LOG}),"
    f" wd AS ({DELETE_WAITERS})"
    " SELECT count(pg_notify(%(channel)s, x)) FROM unnest(%(notify)s::text[]) AS x"
)


# ----- the state of one group, in memory -----------------------------------------------------

_MISSING = object()


@dataclass
class _State:
    """The accounts and tickets as the requests so far left them. Every change goes
    through put() / notify_on(), which keep an undo log, so that a request that fails
    without an answer to store is rolled back in memory (cost: its own changes)."""

    rows: dict[str, LabelAccount]
    waiters: dict[str, tuple[Waiter, ...]]
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


# ----- the group transaction -----------------------------------------------------------------


@dataclass(frozen=True)
class _Found:
    """What step 1 read: the outcomes logged for the ops' request ids, the locked label
    rows with their waiters, the live tickets (locked), the labels a limit says need a
    row, and the history of the tickets that are not live."""

    logged: dict[tuple[str, str, str], tuple[bytes, int | None, bytes]]
    rows: dict[str, LabelAccount]
    waiters: dict[str, tuple[Waiter, ...]]
    tickets: dict[str, Ticket]
    need: set[str]
    history: dict[str, Ticket]


@dataclass
class _Decided:
    """What step 2 decided: the group's state after its requests, one outcome per op,
    and the outcomes to log under their request ids."""

    state: _State
    outcomes: list[Outcome]
    log_rows: list[tuple[Idempotency, int, bytes]]


async def run(conn: Conn, ops: Sequence[Op], now: datetime) -> list[Outcome]:
    """Run `ops` in arrival order in the caller's (pipelined or not) transaction;
    returns one outcome per op: the result, the replay of an earlier call, or the
    exception. The three steps of the module docstring: read, decide, write."""
    found = await _read(conn, ops, now)
    decided = _decide(ops, found, now)
    await _write(conn, found, decided, now)
    for op, outcome in zip(ops, decided.outcomes, strict=True):
        if isinstance(op, ApplyOp) and op.after is not None and isinstance(outcome, Ticket):
            await op.after(conn, outcome)
    return decided.outcomes


async def _read(conn: Conn, ops: Sequence[Op], now: datetime) -> _Found:
    """Step 1: one statement reads the logged outcomes and locks the rows and tickets;
    rarely, more (a ticket whose charged label lost its record, labels a limit covers,
    the history of tickets that are not live)."""
    ticket_ids = sorted({op.ticket_id for op in ops if isinstance(op, _TICKET_OPS)})
    apply_labels = sorted({k for op in ops if isinstance(op, ApplyOp) for k in op.keys})
    logged_ops = [op.idem for op in ops if op.idem is not None]
    cur = await conn.execute(
        READ,
        {
            "callers": sorted({i.caller for i in logged_ops}),
            "methods": sorted({i.method for i in logged_ops}),
            "request_ids": sorted({i.request_id for i in logged_ops}),
            "now": now,
            "apply_labels": apply_labels,
            "ticket_ids": ticket_ids,
        },
    )
    result = await cur.fetchone()
    assert result is not None
    logged_json, rows_json, tickets_json = result
    logged = {
        (g["caller"], g["method"], g["request_id"]): (
            _bytea(g["request_hash"]),
            g["status_code"],
            _bytea(g["response"] or "\\x"),
        )
        for g in logged_json
    }
    rows = {
        x["label"]: account_from_row([x[n] for n in LABEL_NAMES], x["ecm_state"]) for x in rows_json
    }
    waiters = {x["label"]: tuple(map(waiter_from_json, x["waiters"])) for x in rows_json}
    tickets = {t.ticket_id: t for t in map(ticket_from_json, tickets_json)}

    # Rarely needed: a locked ticket whose charged label has no locked row must have lost
    # its record (ECM unregistered); otherwise the ticket appeared after the peek: retry.
    unlocked = sorted({lb for t in tickets.values() for lb in t.charged_labels if lb not in rows})
    if unlocked:
        cur = await conn.execute(EXISTING_LABELS, (unlocked,))
        if await cur.fetchall():
            raise RetryTransaction("a ticket appeared between peek and lock")
    need = await _labels_needing_rows(conn, [k for k in apply_labels if k not in rows])
    # Tickets that are not live: their history answers Release and explains ReportUsed.
    gone = [t for t in ticket_ids if t not in tickets]
    history: dict[str, Ticket] = {}
    if gone:
        cur = await conn.execute(SELECT_HISTORY, (gone,))
        history = {t.ticket_id: t for t in map(ticket_from_history, await cur.fetchall())}
    return _Found(logged, rows, waiters, tickets, need, history)


def _decide(ops: Sequence[Op], found: _Found, now: datetime) -> _Decided:
    """Step 2, in memory: each request in turn on the ledger's rules, seeing the accounts
    as the requests before it left them. A stored answer is replayed; a final error is
    the answer (logged, its effects kept); any other error is undone."""
    state = _State(dict(found.rows), dict(found.waiters), dict(found.tickets))
    decided = _Decided(state, [], [])
    for op in ops:
        earlier = found.logged.get(op.key) if op.idem is not None else None
        if earlier is not None:
            decided.outcomes.append(_replay(op, earlier))
            continue
        snap = state.snapshot()
        try:
            result = _execute(op, state, now, found.need, found.history)
        except Exception as exc:
            if is_final(exc):  # the answer to the request: stored, effects kept
                assert isinstance(exc, LabelrmError)
                if op.idem is not None and op.encoder is not None:
                    code, payload = op.encoder.error(exc)
                    decided.log_rows.append((op.idem, code, payload))
            else:  # bad input, a transient refusal, must wait, ...: undone
                state.restore(snap)
            decided.outcomes.append(exc)
            continue
        if op.idem is not None and op.encoder is not None and result is not None:
            decided.log_rows.append((op.idem, 0, op.encoder.ok(result)))
        decided.outcomes.append(result)
    return decided


async def _write(conn: Conn, found: _Found, decided: _Decided, now: datetime) -> None:
    """Step 3: one statement writes what the group changed (nothing when it changed
    nothing): the rows, tickets, history, logged outcomes, waiters served, wake-ups."""
    state, rows, tickets = decided.state, found.rows, found.tickets
    changed = [row for label, row in state.rows.items() if row is not rows[label]]
    live = [(tid, t) for tid, t in state.tickets.items() if t is not None]
    inserted = [t for tid, t in live if tid not in tickets]
    updated = [t for tid, t in live if tid in tickets and t is not tickets[tid]]
    deleted = [tid for tid, t in state.tickets.items() if t is None and tid in tickets]
    if not (changed or inserted or updated or deleted or state.history or decided.log_rows):
        return
    await conn.execute(
        WRITE,
        {
            "now": now,
            "labels": accounts_json(changed),
            "inserted": json.dumps([ticket_json(t) for t in inserted]),
            "updated": json.dumps([ticket_json(t) for t in updated]),
            "deleted": deleted,
            "history": json.dumps([history_json(a, b) for a, b in state.history]),
            # In key order: two groups inserting the same request ids (a caller reusing
            # one for another request) must not each wait for a key the other holds.
            "log": json.dumps(
                [
                    _log_json(idem, code, payload)
                    for idem, code, payload in sorted(decided.log_rows, key=_log_key)
                ]
            ),
            "waiters": state.waiters_served,
            "channel": CHANNEL,
            "notify": sorted(state.notify),
        },
    )


def _log_key(row: tuple[Idempotency, int, bytes]) -> tuple[str, str, str]:
    idem = row[0]
    return idem.caller, idem.method, idem.request_id


def _log_json(idem: Idempotency, code: int, payload: bytes) -> dict[str, Any]:
    """One request_log row for INSERT_LOG (bytea as PostgreSQL reads it from JSON)."""
    return {
        "caller": idem.caller,
        "method": idem.method,
        "request_id": idem.request_id,
        "request_hash": "\\x" + idem.request_hash.hex(),
        "status_code": code,
        "response": "\\x" + payload.hex(),
    }


def _replay(op: Op, found: tuple[bytes, int | None, Any]) -> Outcome:
    request_hash, code, response = found
    assert op.idem is not None
    try:
        op.idem.check_same(request_hash)
    except InvalidArgument as err:
        return err
    assert code is not None  # outcomes are committed with their request id
    return Replay(status_code=code, response=response)


def _execute(
    op: Op, state: _State, now: datetime, need: set[str], history: dict[str, Ticket]
) -> Ticket | None:
    if isinstance(op, ApplyOp):
        return _apply(op, state, now, need)
    assert isinstance(op, _TICKET_OPS)
    ticket = state.tickets.get(op.ticket_id)
    if isinstance(op, ExpireOp):
        if ticket is None or not lock_expired(ticket, now):
            return None
        return state.end(ticket, now, TicketState.EXPIRED, "lock timeout")
    if ticket is not None and op.from_user:
        check_user_may_end(ticket)
    if isinstance(op, ReleaseOp):
        if ticket is None:
            ended = state.ended.get(op.ticket_id) or history.get(op.ticket_id)
            if ended is None:
                raise not_found("ticket", op.ticket_id)
            return ended  # Release is idempotent: an ended ticket is returned as it is
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
    held = {
        k: h
        for k in op.keys
        if (waiters := state.waiters.get(k))
        and (account := state.rows.get(k)) is not None
        and (h := held_back(account, waiters, seq, now)) is not None
    }
    outcome = decide_apply(op.command(now), state.rows, held)
    if isinstance(outcome, Refusal):
        if op.may_wait:
            raise MustWait(outcome)
        raise Refused(outcome)
    charged, ticket = outcome
    for row in charged:
        state.put(state.rows, row.label, row)
    state.put(state.tickets, ticket.ticket_id, ticket)
    if op.waiter_seq is not None:
        for k in op.keys:
            if k in state.waiters:
                left = tuple(w for w in state.waiters[k] if w.seq != op.waiter_seq)
                state.put(state.waiters, k, left)
        state.waiters_served.append(op.waiter_seq)
    return ticket


# ----- one request inside another transaction (EngineConns, agents, demands, ECMs) -----------


def _only(outcomes: list[Outcome]) -> Ticket | None:
    (outcome,) = outcomes
    if isinstance(outcome, BaseException):
        raise outcome
    assert not isinstance(outcome, Replay)  # ops without a request id are never replayed
    return outcome


async def apply(conn: Conn, cmd: ApplyCommand) -> Ticket | Refusal:
    """Lock every label, check every one, then charge all or none (MustWait when the
    command may wait and does not fit)."""
    op = ApplyOp(
        None,
        None,
        cmd.ticket_id,
        cmd.user,
        cmd.labels,
        cmd.keys,
        cmd.resource,
        cmd.lock_expires_at - cmd.now,
        cmd.waiter_seq,
        cmd.may_wait,
        engine_conn_id=cmd.engine_conn_id,
        external=cmd.external,
    )
    try:
        ticket = _only(await run(conn, [op], cmd.now))
    except Refused as refused:
        return refused.refusal
    assert ticket is not None
    return ticket


async def report_used(conn: Conn, ticket_id: str, used: Resource | None, now: datetime) -> Ticket:
    """LOCKED -> USED: the locked resource moves to used; any unused part is freed."""
    ticket = _only(await run(conn, [ReportOp(None, None, ticket_id, used)], now))
    assert ticket is not None
    return ticket


async def release(conn: Conn, ticket_id: str, now: datetime, reason: str = "released") -> Ticket:
    """End a live ticket; an ended one is returned as it is (Release is idempotent)."""
    ticket = _only(await run(conn, [ReleaseOp(None, None, ticket_id, reason)], now))
    assert ticket is not None
    return ticket


async def release_all(conn: Conn, ticket_ids: Sequence[str], now: datetime, reason: str) -> None:
    """End several live tickets in one group (an ECM leaving)."""
    for outcome in await run(conn, [ReleaseOp(None, None, t, reason) for t in ticket_ids], now):
        if isinstance(outcome, BaseException):
            raise outcome


async def expire_ticket(conn: Conn, ticket_id: str, now: datetime) -> bool:
    """Reclaim one LOCKED ticket past its lock timeout; False if it no longer qualifies."""
    return _only(await run(conn, [ExpireOp(None, None, ticket_id)], now)) is not None


# ----- label rows, limits, queries ---------------------------------------------------


async def lock_labels(conn: Conn, labels: Sequence[str], now: datetime) -> dict[str, LabelAccount]:
    """Lock the rows of `labels` in canonical order (for ECM and demand changes)."""
    cur = await conn.execute(
        f"SELECT {LABEL_COLUMNS}"  # noqa: S608 - constant column list
        " FROM label_resource r WHERE r.label = ANY(%s) ORDER BY r.label FOR UPDATE OF r",
        (list(labels),),
    )
    return {record[0]: account_from_row(record) for record in await cur.fetchall()}


async def load_limit_rules(conn: Conn, key_names: Sequence[str]) -> list[LimitRule]:
    cur = await conn.execute(
        "SELECT pattern, max_resource FROM label_limit WHERE key_names = ANY(%s)",
        (list(key_names),),
    )
    return [LimitRule(LabelPattern.parse(p), res(m)) for p, m in await cur.fetchall()]


def key_names(label: str) -> str:
    return ",".join(LabelKey.parse(label).keys())


async def _labels_needing_rows(conn: Conn, missing: Sequence[str]) -> set[str]:
    """Of labels without a record, those a configured limit applies to."""
    if not missing:
        return set()
    rules = await load_limit_rules(conn, sorted({key_names(m) for m in missing}))
    return {m for m in missing if best_limit(LabelKey.parse(m), rules) is not None}
