"""Connection pool, migrations, transaction retry and request-id idempotency."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any, Protocol, TypeVar, TypeVarTuple

import psycopg
import tenacity
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolTimeout

# Re-exported: the store's callers name them from here too.
from rm_server.domain.idempotency import Idempotency as Idempotency
from rm_server.domain.idempotency import Replay as Replay
from rm_server.errors import (
    FailedPrecondition,
    LabelrmError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
R = TypeVar("R", contravariant=True)


class OutcomeEncoder(Protocol[R]):
    """How a call's outcome is stored under its request id: the service layer's encoding,
    the one a replay is answered with (a result, or the RM error that ended the call)."""

    def ok(self, result: R) -> bytes: ...

    def error(self, err: LabelrmError) -> tuple[int, bytes]: ...


Conn = psycopg.AsyncConnection[Any]

# Session-level advisory lock held while migrating, so replicas starting together
# apply each migration once.
MIGRATION_LOCK_ID = 0x6C61_6265_6C72_6D01
# Transaction-level advisory lock: exclusive when limits change, shared while a
# label row is created from a limit, so a row never misses a concurrent limit change.
LIMITS_LOCK_ID = 0x6C61_6265_6C72_6D02

# The errors that can be the final answer to a request (docs/architecture.md,
# "Idempotency"): committed with the request id so that a retry gets the same answer,
# unless transient (RESOURCE_EXHAUSTED and other refusals a retry may overcome).
# Bad input (INVALID_ARGUMENT) is never stored: nothing was done.
FINAL_ERRORS = (NotFound, FailedPrecondition, ResourceExhausted)


def is_final(exc: BaseException) -> bool:
    """Whether `exc` is a definitive outcome, stored under the request id (AIP-155:
    a transient refusal is not, so a retry with the same id may succeed)."""
    return isinstance(exc, FINAL_ERRORS) and not exc.transient


@dataclass
class _Failed:
    err: LabelrmError


class RetryTransaction(Exception):
    """Raised inside a transaction body to roll back and run it again."""


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(
        exc,
        RetryTransaction
        | pg_errors.SerializationFailure
        | pg_errors.DeadlockDetected
        | psycopg.OperationalError
        | PoolTimeout,
    )


def _is_retryable_unique(exc: BaseException) -> bool:
    return _is_retryable(exc) or isinstance(exc, pg_errors.UniqueViolation)


# The warning PostgreSQL gives when a COMMIT's wait for the synchronous standby is
# cancelled (statement_timeout, a cancel request): the transaction is committed on the
# primary but perhaps on no standby, and the COMMIT still answers success. It is in
# English where lc_messages is C (deploy/ha sets it).
UNCONFIRMED_COMMIT = "canceling wait for synchronous replication"

# TCP keepalives: a peer that vanished (a lost host, a partition) is noticed within
# KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT seconds even on an idle
# connection (the LISTEN one); tcp_user_timeout does the same for data sent and never
# acknowledged. Neither sees a frozen server on a live host (its kernel acknowledges):
# the client-side deadline of `Database.run` does.
KEEPALIVE_IDLE = 5
KEEPALIVE_INTERVAL = 2
KEEPALIVE_COUNT = 3


def connection_kwargs(
    conninfo: str, timeout: float, connect_timeout: float = 5.0
) -> dict[str, Any]:
    """The libpq parameters every rm-server connection adds to `conninfo`: TCP
    keepalives, `tcp_user_timeout`, and (as session settings) a `statement_timeout` and
    an `idle_in_transaction_session_timeout` of `timeout` seconds, so that the server
    ends a statement, or a transaction whose client went away, within the same bound
    the client waits (`Database.run`). What the URL already says is kept: its options,
    and its connect_timeout (per host of a multi-host URL: a frozen host costs a new
    connection that long before libpq tries the next)."""
    ms = max(1, int(timeout * 1000))
    given = conninfo_to_dict(conninfo)
    extra = {} if "connect_timeout" in given else {"connect_timeout": max(2, int(connect_timeout))}
    return {
        **extra,
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE,
        "keepalives_interval": KEEPALIVE_INTERVAL,
        "keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": ms,
        "options": f"{given.get('options') or ''} -c statement_timeout={ms}"
        f" -c idle_in_transaction_session_timeout={2 * ms}".strip(),
    }


def shut_down(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shut the socket of `conn` down under whatever waits on it: the wait ends at once
    with an OperationalError (the connection is then broken and the pool replaces it).
    Unlike cancelling the waiting task, it sends the server nothing (psycopg would send
    a cancel request, then wait up to 10 s for a server that may be frozen) and unlike
    closing the descriptor it cannot hit a descriptor reused meanwhile."""
    with contextlib.suppress(OSError, psycopg.Error):
        dup = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


async def ping(conn: psycopg.AsyncConnection[Any], seconds: float) -> None:
    """`SELECT 1` on `conn`, which must answer within `seconds` (else its socket is shut
    down): psycopg.OperationalError if it does not (for a connection held outside the
    pool: the LISTEN one, the replica's presence)."""
    watch = _Deadline(conn, asyncio.get_running_loop().time() + seconds)
    try:
        await conn.execute("SELECT 1")
    finally:
        watch.cancel()


class _Deadline:
    """Shuts a connection down (`shut_down`) if it is still in use at `at` (the
    event loop's clock); `fired` tells afterwards whether it did."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], at: float) -> None:
        self.fired = False
        self._conn = conn
        self._handle = asyncio.get_running_loop().call_at(at, self._fire)

    def _fire(self) -> None:
        self.fired = True
        shut_down(self._conn)

    def cancel(self) -> None:
        self._handle.cancel()


class _Notices:
    """Whether a COMMIT on this connection answered success without the synchronous
    standby's confirmation (UNCONFIRMED_COMMIT), while installed on it."""

    def __init__(self) -> None:
        self.unconfirmed = False

    def __call__(self, diag: psycopg.errors.Diagnostic) -> None:
        if (diag.message_primary or "").startswith(UNCONFIRMED_COMMIT):
            self.unconfirmed = True


class Database:
    """An async connection pool plus the transaction discipline of the store.

    `timeout`: seconds a transaction may take (`run`), the statement_timeout of every
    statement, and the bound on TCP-level silence of every connection (keepalives,
    tcp_user_timeout); `slow_timeout`: the same for the transactions that read or
    delete in bulk (consistency checks, overviews, retention), which pass it to `run`;
    `connect_timeout`: seconds to wait for a connection."""

    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 2,
        max_size: int = 16,
        connect_timeout: float = 5.0,
        attempts: int = 4,
        timeout: float = 5.0,
        slow_timeout: float = 60.0,
    ) -> None:
        self.conninfo = conninfo
        self.attempts = attempts
        self.timeout = timeout
        self.slow_timeout = slow_timeout
        self.connect_kwargs = connection_kwargs(conninfo, timeout, connect_timeout)
        self._drained_at = 0.0
        self._background: set[asyncio.Task[None]] = set()
        self.pool = AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            timeout=connect_timeout,
            open=False,
            kwargs={"autocommit": True, **self.connect_kwargs},
            # A failed background reconnection is not retried on a schedule (its backoff
            # doubles without a cap, and could outlast a failover by many seconds): a
            # caller that finds no connection makes the pool open one, a fresh try.
            reconnect_timeout=0,
        )

    async def connect(self) -> psycopg.AsyncConnection[Any]:
        """A connection of its own (not from the pool), with the same keepalives and
        timeouts as the pool's (the LISTEN connection, the replica's presence)."""
        return await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, **self.connect_kwargs
        )

    async def open(self) -> None:
        await self.pool.open(wait=True, timeout=30)

    async def close(self) -> None:
        await self.pool.close()

    async def migrate(self) -> list[str]:
        """Apply the numbered migrations not yet applied; safe with concurrent replicas."""
        applied: list[str] = []
        async with await self.connect() as conn:
            # A migration may rewrite a big table, and waits for the other replicas'
            # advisory lock: no statement bound here (the keepalives stay).
            await conn.execute("SET statement_timeout = 0")
            await conn.execute("SET idle_in_transaction_session_timeout = 0")
            await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_ID,))
            try:
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migration ("
                    " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                cur = await conn.execute("SELECT version FROM schema_migration")
                done = {row[0] for row in await cur.fetchall()}
                folder = resources.files("rm_server.store") / "migrations"
                for entry in sorted(folder.iterdir(), key=lambda e: e.name):
                    version = entry.name.removesuffix(".sql")
                    if not entry.name.endswith(".sql") or version in done:
                        continue
                    async with conn.transaction():
                        await conn.execute(entry.read_text().encode())
                        await conn.execute(
                            "INSERT INTO schema_migration (version) VALUES (%s)", (version,)
                        )
                    log.info("applied migration %s", version)
                    applied.append(version)
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_ID,))
        return applied

    async def run(
        self,
        body: Callable[[Conn, *Ts], Awaitable[T]],
        *args: *Ts,
        read_only: bool = False,
        pipeline: bool = False,
        retry_unique: bool = False,
        bound: float | None = None,
        one_statement: bool = False,
    ) -> T:
        """Run `body(conn, *args)` in one transaction, retrying serialization failures,
        deadlocks and lost connections; a database that stays away becomes Unavailable.

        Bounded: after `bound` seconds (default `self.timeout`; each statement's
        statement_timeout is the same), retries included, the connection in use is shut
        down and the call raises Unavailable: a frozen or unreachable server (whose
        kernel may still acknowledge every packet) stalls no caller, nor a request
        group, longer. The caller retries with its request id: the transaction either
        committed (the retry gets its stored outcome) or did not.

        `pipeline`: in psycopg pipeline mode (BEGIN, the statements and COMMIT go out
        without waiting; a fetch waits for what was sent). `retry_unique`: a unique
        violation also retries (a concurrent transaction inserted the same key).
        `one_statement`: `body` runs a single statement, which is its own transaction
        (autocommit): no BEGIN and COMMIT around it (a read polled often)."""
        retryable = _is_retryable_unique if retry_unique else _is_retryable
        seconds = self.timeout if bound is None else bound
        deadline = asyncio.get_running_loop().time() + seconds
        try:
            # The first attempt without the retry machinery (it costs per call); the
            # retries, if any, with it.
            try:
                return await self._attempt(
                    body, args, read_only, pipeline, deadline, bound, one_statement
                )
            except Exception as exc:
                if self.attempts <= 1 or not retryable(exc):
                    raise
            await asyncio.sleep(random.uniform(0, 0.04))
            async for attempt in tenacity.AsyncRetrying(
                retry=tenacity.retry_if_exception(retryable),
                stop=tenacity.stop_after_attempt(self.attempts - 1),
                wait=tenacity.wait_random_exponential(multiplier=0.02, max=0.5),
                reraise=True,
            ):
                with attempt:
                    return await self._attempt(
                        body, args, read_only, pipeline, deadline, bound, one_statement
                    )
        except (psycopg.OperationalError, PoolTimeout) as exc:
            if asyncio.get_running_loop().time() >= deadline:
                raise Unavailable(f"database did not answer within {seconds:g} s") from exc
            raise Unavailable(f"database unavailable: {exc}".strip()) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(
        self,
        body: Callable[[Conn, *Ts], Awaitable[T]],
        args: tuple[*Ts],
        read_only: bool,
        pipeline: bool,
        deadline: float,
        bound: float | None,
        one_statement: bool = False,
    ) -> T:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise PoolTimeout("no time left for another attempt")
        async with self.pool.connection(timeout=left) as conn:
            watch = _Deadline(conn, deadline)
            notices = _Notices()
            conn.add_notice_handler(notices)
            try:
                if one_statement:  # autocommit: the statement is its own transaction
                    result = await body(conn, *args)
                else:
                    result = await self._transaction(conn, body, args, read_only, pipeline, bound)
            finally:
                watch.cancel()
                conn.remove_notice_handler(notices)
                if watch.fired:
                    self._drain_soon()
            if notices.unconfirmed:
                # Committed here, perhaps on no standby: this primary may yet be lost
                # with it. Not an answer to acknowledge; a retry with the request id gets
                # the stored outcome once it is replicated (claim_request).
                raise Unavailable("the commit was not confirmed by the synchronous standby")
            return result

    @staticmethod
    async def _transaction(
        conn: Conn,
        body: Callable[[Conn, *Ts], Awaitable[T]],
        args: tuple[*Ts],
        read_only: bool,
        pipeline: bool,
        bound: float | None,
    ) -> T:
        async def bounded_body(c: Conn) -> T:
            if read_only:
                await c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if bound is not None:  # this transaction's own statement bound
                ms = sql.Literal(max(1, int(bound * 1000)))
                await c.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(ms))
            return await body(c, *args)

        if pipeline:
            return await _pipelined_transaction(conn, bounded_body)
        async with conn.transaction():
            return await bounded_body(conn)

    def _drain_soon(self) -> None:
        """A connection outlived its deadline: the server may be frozen, and so every
        idle connection to it; replace them (once per bound) rather than let each
        caller find out after a full timeout. New connections find the primary anew
        (libpq's target_session_attrs on a multi-host URL)."""
        now = time.monotonic()
        if now - self._drained_at < self.timeout:
            return
        self._drained_at = now
        log.warning("a database connection did not answer within %g s: reconnecting", self.timeout)
        task = asyncio.get_running_loop().create_task(self.pool.drain())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run_idempotent(
        self,
        idem: Idempotency,
        now: datetime,
        body: Callable[[Conn], Awaitable[T]],
        encoder: OutcomeEncoder[T],
    ) -> T | Replay:
        """Run a mutating `body` at most once per request id.

        The request id is claimed with the first statement of the transaction
        (a concurrent duplicate blocks on the primary key until this commits),
        and the outcome, success or final error, is stored in the same commit.
        """

        async def attempt(conn: Conn) -> T | Replay | _Failed:
            replay = await claim_request(conn, idem, now)
            if replay is not None:
                return replay
            try:
                result = await body(conn)
            except FINAL_ERRORS as err:
                if not is_final(err):
                    raise  # rolled back with the request id's claim: a retry runs afresh
                code, payload = encoder.error(err)
                await finish_request(conn, idem, code, payload)
                return _Failed(err)
            await finish_request(conn, idem, 0, encoder.ok(result))
            return result

        outcome = await self.run(attempt)
        if isinstance(outcome, _Failed):
            raise outcome.err
        return outcome

    async def purge_request_ids(self, older_than: datetime, batch: int = 5000) -> int:
        return await self.purge("request_log", older_than, batch)

    async def purge(self, table: str, older_than: datetime, batch: int = 5000) -> int:
        """Delete up to `batch` rows of a table in PURGE_AGE_COLUMN older than
        `older_than` (a bounded transaction; the sweeps call it again next round)."""
        statement = _PURGE_SQL.format(
            table=sql.Identifier(table), column=sql.Identifier(PURGE_AGE_COLUMN[table])
        )
        return await self.run(
            lambda c: _rowcount(c, statement, (older_than, batch)), bound=self.slow_timeout
        )


# Retention: the tables whose old rows go, by the column that dates them (only ended
# rows have an ended_at; demand_event rows go with their demand, ON DELETE CASCADE; a
# node's events outlive the node, so they go by their own time).
PURGE_AGE_COLUMN = {
    "request_log": "created_at",
    "ticket_history": "ended_at",
    "engine_conn": "ended_at",
    "demand": "ended_at",
    "ecm_event": "at",
}
_PURGE_SQL = sql.SQL(
    "DELETE FROM {table} WHERE ctid = ANY(ARRAY("
    " SELECT ctid FROM {table} WHERE {column} < %s LIMIT %s))"
)


async def _pipelined_transaction(conn: Conn, body: Callable[[Conn], Awaitable[T]]) -> T:
    """`body` in one transaction in pipeline mode, BEGIN and COMMIT sent with the
    statements around them: a body that reads once and then writes costs two round
    trips. (psycopg's transaction() in pipeline mode syncs three more times, after
    BEGIN, after the body and after COMMIT: five, each a turn of a busy event loop.)"""
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            result = await body(conn)
            await conn.execute("COMMIT")
    except BaseException:
        # Leaving the pipeline synced it (even on an error), so the status is the server's.
        status = conn.info.transaction_status
        if status is TransactionStatus.INTRANS:
            # Python gave up (RetryTransaction, a bug): every statement sent has run.
            with contextlib.suppress(psycopg.Error):
                await conn.execute("ROLLBACK")
        elif status is not TransactionStatus.IDLE:
            # The server refused a statement (or the call was cancelled mid-way): it
            # skipped the rest of the pipeline, statements psycopg was preparing on the
            # way included, so the connection's prepared statements no longer match
            # psycopg's cache. Closed, it is replaced by the pool.
            await conn.close()
        raise
    return result


async def _rowcount(conn: Conn, statement: sql.Composed, params: tuple[Any, ...]) -> int:
    cur = await conn.execute(statement, params)
    return cur.rowcount


async def claim_request(conn: Conn, idem: Idempotency, now: datetime) -> Replay | None:
    cur = await conn.execute(
        "INSERT INTO request_log (caller, method, request_id, request_hash, created_at)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
        (idem.caller, idem.method, idem.request_id, idem.request_hash, now),
    )
    if await cur.fetchone() is not None:
        return None
    # pg_current_xact_id() gives this transaction an id, so its COMMIT waits for the
    # synchronous standby to confirm the WAL up to here: the outcome replayed below
    # (perhaps committed by an attempt whose COMMIT was never confirmed, see
    # UNCONFIRMED_COMMIT) is acknowledged only once a standby has it too.
    cur = await conn.execute(
        "SELECT request_hash, status_code, response, pg_current_xact_id() FROM request_log"
        " WHERE caller = %s AND method = %s AND request_id = %s",
        (idem.caller, idem.method, idem.request_id),
    )
    row = await cur.fetchone()
    if row is None or row[1] is None:  # pragma: no cover - the claim is committed with an outcome
        raise FailedPrecondition("request id is still being processed", state="IN_FLIGHT")
    idem.check_same(bytes(row[0]))
    return Replay(status_code=row[1], response=bytes(row[2]))


async def finish_request(conn: Conn, idem: Idempotency, code: int, payload: bytes) -> None:
    await conn.execute(
        "UPDATE request_log SET status_code = %s, response = %s"
        " WHERE caller = %s AND method = %s AND request_id = %s",
        (code, payload, idem.caller, idem.method, idem.request_id),
    )


def page_filters(*conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """The WHERE conditions of a list page, only those whose value is set: `(sql, value)`
    pairs, each `sql` a fixed fragment with one placeholder. A condition left out of the
    statement (rather than `%s = '' OR col = %s`) lets each combination of filters have its
    own plan, one that uses the index matching its filter and sort order; a generic plan
    for every combination at once can use none and reads the table from the start."""
    parts = [fragment for fragment, value in conditions if value not in ("", None)]
    values = [value for _, value in conditions if value not in ("", None)]
    return " AND ".join(parts) or "true", values


async def page_rows(conn: Conn, query: str, params: Sequence[Any], order: str) -> list[Any]:
    """The rows of a list page (`query`, in the order of its column `order`), each as a
    JSON object of its columns (timestamps as ISO 8601 text), read as one JSON document:
    decoding it in one call costs a fraction of what psycopg's decoding of each JSON
    column of each row apart costs (four or five calls per row of a page of 500)."""
    cur = await conn.execute(
        f"SELECT coalesce(json_agg(q ORDER BY q.{order}), '[]') FROM ({query}) q",  # noqa: S608
        params,
    )
    row = await cur.fetchone()
    assert row is not None
    return list(row[0])
