"""Reads the access policy needs: who owns a ticket, an EngineConn or a demand. Owners
never change after creation, so reading them outside the transaction that later acts on
the object is safe."""

from __future__ import annotations

from rm_server.store.db import Conn


async def _one(conn: Conn, sql: str, *params: str) -> str | None:
    cur = await conn.execute(sql, params)
    row = await cur.fetchone()
    return None if row is None else str(row[0])


async def ticket_owner(conn: Conn, ticket_id: str) -> str | None:
    """The user of a live or ended ticket."""
    return await _one(
        conn,
        "SELECT user_name FROM ticket WHERE ticket_id = %s"
        " UNION ALL SELECT user_name FROM ticket_history WHERE ticket_id = %s LIMIT 1",
        ticket_id,
        ticket_id,
    )


async def engine_conn_owner(conn: Conn, ec_id: str) -> str | None:
    return await _one(conn, "SELECT user_name FROM engine_conn WHERE ec_id = %s", ec_id)
