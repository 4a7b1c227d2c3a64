"""Apply, ReportUsed, Release and lock expiry: one path for one request or many.

`run(conn, ops, now)` runs a group of requests (rm_server/app/batching.py groups
concurrent ones; a group of one is the single request) in the caller's transaction,
in arrival order, as if each ran alone one after the other:

1. READ, one statement: the outcomes already logged for the ops' request ids; every
   label row the group touches, locked in canonical order (the labels the Apply
   requests name and those the tickets are charged to), with the live waiters queued
   on each; then the live tickets, locked;
2. DECIDE, in memory: a request whose id has an outcome logged is answered with it;
   the others go to the domain's decision of the group (rm_server/domain/
   ticket_group.py: the ledger's rules, request by request, one outcome value each:
   the ticket, a refusal, labels needing records, or the domain's error, which becomes
   the RM's here, in rm_server.errors.as_rm_error); the outcomes that are final
   answers are encoded for request_log (the caller's OutcomeEncoder);
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
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rm_server.domain.errors import DomainError
from rm_server.domain.labels import LabelKey
from rm_server.domain.ledger import ApplyCommand, LabelAccount, check_accounts
from rm_server.domain.limits import LabelPattern, LimitRule, best_limit
from rm_server.domain.model import Refusal, Ticket
from rm_server.domain.resources import Resource
from rm_server.domain.ticket_group import GroupState, GroupView, NeedsRows, decide_group
from rm_server.errors import as_rm_error
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
from rm_server.store.ticket_ops import ApplyOp, ExpireOp, Op, ReleaseOp, ReportOp
from rm_server.store.waiters import locked_waiters

__all__ = ["ApplyCommand", "LabelAccount", "NeedsRows", "check_accounts", "run"]

# What `run` answers for each op: the ticket (None: nothing to expire), the replay of an
# earlier call, a Refusal or NeedsRows (values: the caller waits, refuses, or creates the
# records and tries again), or the error that ended it (the RM's; anything else a bug).
Outcome = Ticket | Replay | Refusal | NeedsRows | BaseException | None

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


# ----- the group transaction -----------------------------------------------------------------


def _bytea(value: str) -> bytes:
    """A bytea as PostgreSQL writes it in JSON: "\\x" and hex digits."""
    return bytes.fromhex(value[2:])


@dataclass(frozen=True)
class _Found:
    """What step 1 read: the outcomes logged for the ops' request ids, and what the
    domain decides on (the locked accounts with their waiters, the live tickets, the
    labels a limit says need a record, the history of the tickets that are not live)."""

    logged: dict[tuple[str, str, str], tuple[bytes, int | None, bytes]]
    view: GroupView


async def run(conn: Conn, ops: Sequence[Op], now: datetime) -> list[Outcome]:
    """Run `ops` in arrival order in the caller's (pipelined or not) transaction;
    returns one outcome per op (`Outcome`). The three steps of the module docstring:
    read, decide, write."""
    found = await _read(conn, ops, now)
    outcomes: list[Outcome] = [None] * len(ops)
    pending: list[int] = []  # the ops the domain decides (no logged outcome)
    for i, op in enumerate(ops):
        earlier = found.logged.get(op.key) if op.idem is not None else None
        if earlier is None:
            pending.append(i)
        else:
            outcomes[i] = _replay(op, earlier)
    decision = decide_group([ops[i].command(now) for i in pending], found.view, now)
    log_rows: list[tuple[Idempotency, int, bytes]] = []
    for i, decided in zip(pending, decision.outcomes, strict=True):
        outcomes[i] = _answer(ops[i], decided, log_rows)
    await _write(conn, found.view, decision.state, log_rows, now)
    for op, outcome in zip(ops, outcomes, strict=True):
        if isinstance(op, ApplyOp) and op.after is not None and isinstance(outcome, Ticket):
            await op.after(conn, outcome)
    return outcomes


def _answer(op: Op, decided: Outcome, log_rows: list[tuple[Idempotency, int, bytes]]) -> Outcome:
    """The domain's outcome of `op` as the store answers it: an error becomes the RM's
    (rm_server.errors.as_rm_error); a final answer (a ticket, or a final error) is
    encoded for request_log under the op's request id."""
    if isinstance(decided, Exception):
        err = as_rm_error(decided)
        if err is None:  # a bug: the caller's call fails with it (INTERNAL)
            return decided
        if op.idem is not None and op.encoder is not None and is_final(err):
            code, payload = op.encoder.error(err)
            log_rows.append((op.idem, code, payload))
        return err
    if isinstance(decided, Ticket) and op.idem is not None and op.encoder is not None:
        log_rows.append((op.idem, 0, op.encoder.ok(decided)))
    return decided


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
    return _Found(logged, GroupView(rows, waiters, tickets, frozenset(need), history))


async def _write(
    conn: Conn,
    view: GroupView,
    state: GroupState,
    log_rows: list[tuple[Idempotency, int, bytes]],
    now: datetime,
) -> None:
    """Step 3: one statement writes what the group changed (nothing when it changed
    nothing): the rows, tickets, history, logged outcomes, waiters served, wake-ups."""
    rows, tickets = view.accounts, view.tickets
    changed = [row for label, row in state.accounts.items() if row is not rows[label]]
    live = [(tid, t) for tid, t in state.tickets.items() if t is not None]
    inserted = [t for tid, t in live if tid not in tickets]
    updated = [t for tid, t in live if tid in tickets and t is not tickets[tid]]
    deleted = [tid for tid, t in state.tickets.items() if t is None and tid in tickets]
    if not (changed or inserted or updated or deleted or state.history or log_rows):
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
                    for idem, code, payload in sorted(log_rows, key=_log_key)
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
    """The outcome logged for `op`'s request id, if the request is the same (a request id
    reused for another request is refused, REQUEST_ID_REUSED)."""
    request_hash, code, response = found
    assert op.idem is not None
    try:
        op.idem.check_same(request_hash)
    except DomainError as err:
        return as_rm_error(err) or err
    assert code is not None  # outcomes are committed with their request id
    return Replay(status_code=code, response=response)


# ----- one request inside another transaction (EngineConns, agents, demands, ECMs) -----------


def _only(outcomes: list[Outcome]) -> Ticket | Refusal | NeedsRows | None:
    (outcome,) = outcomes
    if isinstance(outcome, BaseException):
        raise outcome
    assert not isinstance(outcome, Replay)  # ops without a request id are never replayed
    return outcome


def _ticket(outcomes: list[Outcome]) -> Ticket:
    ticket = _only(outcomes)
    assert isinstance(ticket, Ticket)  # only an Apply is refused, only an expiry is None
    return ticket


async def apply(conn: Conn, cmd: ApplyCommand) -> Ticket | Refusal | NeedsRows:
    """Lock every label, check every one, then charge all or none: the ticket, the
    refusal, or the labels that need a record first (a limit covers them)."""
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
        engine_conn_id=cmd.engine_conn_id,
        external=cmd.external,
    )
    outcome = _only(await run(conn, [op], cmd.now))
    assert outcome is not None
    return outcome


async def report_used(conn: Conn, ticket_id: str, used: Resource | None, now: datetime) -> Ticket:
    """LOCKED -> USED: the locked resource moves to used; any unused part is freed."""
    return _ticket(await run(conn, [ReportOp(None, None, ticket_id, used)], now))


async def release(conn: Conn, ticket_id: str, now: datetime, reason: str = "released") -> Ticket:
    """End a live ticket; an ended one is returned as it is (Release is idempotent)."""
    return _ticket(await run(conn, [ReleaseOp(None, None, ticket_id, reason)], now))


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
