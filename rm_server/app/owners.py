"""Who owns a ticket or an EngineConn, for the access policy (rm_server/security/policy.py,
its `Owners`): the security layer asks through this use case, never the store itself."""

from __future__ import annotations

from rm_server.store import owners
from rm_server.store.db import Database


class DbOwners:
    """`policy.Owners` on the database (one indexed read per ownership check)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def ticket_owner(self, ticket_id: str) -> str | None:
        """The user of a live or ended ticket (None: no such ticket)."""
        return await self.db.run(lambda c: owners.ticket_owner(c, ticket_id), read_only=True)

    async def engine_conn_owner(self, ec_id: str) -> str | None:
        """The user of an EngineConn (None: no such EngineConn)."""
        return await self.db.run(lambda c: owners.engine_conn_owner(c, ec_id), read_only=True)
