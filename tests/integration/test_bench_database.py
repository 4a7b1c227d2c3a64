"""The benchmarks' database: the server processes whose CPU is booked as PostgreSQL's.

A backend that works for the benchmark's database must be found every time, and a
backend on another database must not be counted. (Under load the lookup used to miss
them all: the probe's connection closed before its parent was looked up, and the CPU
showed as `other`. That race needs a loaded machine; this checks what must hold.)"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from bench.common import BenchDatabase
from tests.support.database import Postgres


@pytest.fixture
def bench_db(postgres: Postgres) -> Iterator[BenchDatabase]:
    db = BenchDatabase(given_url=postgres.admin_url).start()
    try:
        yield db
    finally:
        db.stop()


def _backend_pid(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def test_postgres_pids_finds_our_backends_every_time_and_no_others(
    bench_db: BenchDatabase, database_url: str
) -> None:
    with (
        psycopg.connect(bench_db.url, autocommit=True) as ours,
        psycopg.connect(database_url, autocommit=True) as elsewhere,
    ):
        our_backend = _backend_pid(ours)
        other_backend = _backend_pid(elsewhere)
        for _ in range(20):
            pids = bench_db.postgres_pids()
            assert our_backend in pids
            assert other_backend not in pids
            # The auxiliary processes (checkpointer, WAL writer, ...) are counted too.
            assert len(pids) > 1
