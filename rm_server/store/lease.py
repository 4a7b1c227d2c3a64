"""Leases of background jobs: one replica runs each job at a time (see rm_server.app.background)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

Conn = psycopg.AsyncConnection[Any]


async def hold(conn: Conn, job: str, holder: str, now: datetime, expires_at: datetime) -> bool:
    """Take or renew the lease of `job` for `holder` until `expires_at`: True if `holder`
    holds it now (it held it already, nobody did, or the last holder's lease ran out)."""
    cur = await conn.execute(
        "INSERT INTO background_lease (job, holder, expires_at) VALUES (%s, %s, %s)"
        " ON CONFLICT (job) DO UPDATE"
        " SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at"
        " WHERE background_lease.holder = EXCLUDED.holder OR background_lease.expires_at < %s"
        " RETURNING 1",
        (job, holder, expires_at, now),
    )
    return await cur.fetchone() is not None


async def holders(conn: Conn) -> dict[str, tuple[str, datetime]]:
    """Every job's lease: job -> (holder, expires_at)."""
    cur = await conn.execute("SELECT job, holder, expires_at FROM background_lease ORDER BY job")
    return {job: (holder, expires) for job, holder, expires in await cur.fetchall()}
