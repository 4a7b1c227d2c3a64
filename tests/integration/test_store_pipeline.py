"""Database.run(pipeline=True), the transaction of every request group: BEGIN and
COMMIT travel with the statements around them, and whatever fails, the transaction
is rolled back before the connection goes back to the pool."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pg_errors

from rm_server.store.db import Conn, Database

PROBE = (
    "CREATE TABLE pipe_probe (k text PRIMARY KEY);"
    " CREATE TABLE pipe_deferred (k text, CONSTRAINT once UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)"
)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(PROBE)
    database = Database(database_url, min_size=1, max_size=1, attempts=1)
    await database.open()
    try:
        yield database
    finally:
        await database.close()


def rows(database_url: str, table: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [r[0] for r in conn.execute(f"SELECT k FROM {table} ORDER BY k").fetchall()]  # noqa: S608


async def test_the_body_runs_in_one_explicit_transaction(db: Database, database_url: str) -> None:
    async def body(conn: Conn) -> tuple[object, object]:
        await conn.execute("INSERT INTO pipe_probe VALUES ('a')")
        # SAVEPOINT is refused outside a transaction block (pipeline mode's implicit
        # transaction is not one): it passes only after an explicit BEGIN.
        await conn.execute("SAVEPOINT inside")
        cur = await conn.execute("SELECT pg_current_xact_id()::text")
        first = (await cur.fetchone())[0]  # type: ignore[index]
        cur = await conn.execute("SELECT pg_current_xact_id()::text")
        return first, (await cur.fetchone())[0]  # type: ignore[index]

    first, second = await db.run(body, pipeline=True)
    assert first == second
    assert rows(database_url, "pipe_probe") == ["a"]


async def test_an_exception_in_python_rolls_back(
    db: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(conn: Conn) -> None:
        await conn.execute("INSERT INTO pipe_probe VALUES ('a')")
        cur = await conn.execute("SELECT 1")
        await cur.fetchone()
        raise RuntimeError("decided against it")

    with caplog.at_level(logging.WARNING, logger="psycopg"):
        with pytest.raises(RuntimeError, match="decided against it"):
            await db.run(body, pipeline=True)
        # The one connection of the pool is usable at once, and the pool found nothing
        # to roll back itself.
        assert await db.run(_count_probe, pipeline=True) == 0
    assert rows(database_url, "pipe_probe") == []
    assert not [r for r in caplog.records if "rolling back" in r.getMessage()]


async def test_a_failing_statement_rolls_back_what_came_before(
    db: Database, database_url: str
) -> None:
    async def body(conn: Conn) -> None:
        await conn.execute("INSERT INTO pipe_probe VALUES ('a')")
        await conn.execute("INSERT INTO pipe_probe VALUES ('b')")
        await conn.execute("INSERT INTO pipe_probe VALUES ('a')")  # fails at the sync

    with pytest.raises(pg_errors.UniqueViolation):
        await db.run(body, pipeline=True)
    assert rows(database_url, "pipe_probe") == []
    assert await db.run(_count_probe, pipeline=True) == 0


async def test_a_failing_commit_raises_and_keeps_nothing(db: Database, database_url: str) -> None:
    async def body(conn: Conn) -> None:
        await conn.execute("INSERT INTO pipe_probe VALUES ('a')")
        await conn.execute("INSERT INTO pipe_deferred VALUES ('x'), ('x')")  # checked at COMMIT

    with pytest.raises(pg_errors.UniqueViolation):
        await db.run(body, pipeline=True)
    assert rows(database_url, "pipe_probe") == []
    assert rows(database_url, "pipe_deferred") == []
    assert await db.run(_count_probe, pipeline=True) == 0


async def test_a_refused_statement_leaves_no_stale_prepared_statement(db: Database) -> None:
    """psycopg prepares a statement on its sixth run. Here that Parse travels behind a
    refused statement, so the server skips it; the connection must not be reused as
    if it had run (the next transaction would fail: prepared statement does not exist)."""

    async def refused_then_count(conn: Conn) -> None:
        await conn.execute("INSERT INTO pipe_probe VALUES ('a'), ('a')")
        await conn.execute(COUNT)

    for _ in range(8):
        with pytest.raises(pg_errors.UniqueViolation):
            await db.run(refused_then_count, pipeline=True)
        assert await db.run(_count_probe, pipeline=True) == 0


COUNT = "SELECT count(*) FROM pipe_probe"


async def _count_probe(conn: Conn) -> int:
    cur = await conn.execute(COUNT)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_read_then_write_transaction_is_two_round_trips(
    db: Database, tmp_path: Path
) -> None:
    """Round trips are what a busy event loop charges for: the body's fetch flushes
    (BEGIN and the read answered together) and the end syncs (the write and COMMIT
    answered together). psycopg's transaction() in pipeline mode syncs three more times."""
    trace = tmp_path / "libpq.trace"

    async def body(conn: Conn) -> None:
        cur = await conn.execute("SELECT count(*) FROM pipe_probe")
        await cur.fetchone()
        await conn.execute("INSERT INTO pipe_probe VALUES ('a')")

    fd = os.open(trace, os.O_WRONLY | os.O_CREAT)
    try:
        async with db.pool.connection() as conn:  # the pool's only connection
            conn.pgconn.trace(fd)
        await db.run(body, pipeline=True)
        async with db.pool.connection() as conn:
            conn.pgconn.untrace()
    finally:
        os.close(fd)
    # libpq's trace: timestamp, direction (F: from us, B: from the server), length,
    # message, ... (libpq may flush its buffer twice: lines are unique by timestamp).
    lines = dict.fromkeys(trace.read_text().splitlines())
    directions = [f[1] for f in (line.split("\t") for line in lines) if len(f) > 3]
    round_trips = sum(1 for a, b in itertools.pairwise(directions) if (a, b) == ("F", "B"))
    assert round_trips == 2
