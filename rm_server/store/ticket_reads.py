"""Reading tickets: one by id (live, else from the history), the live ones page by page,
and those whose lock has expired (the sweep's batch).

Writes go through `rm_server.store.tickets.run`, the one path of every change.
"""

from __future__ import annotations

from datetime import datetime

from rm_server.domain.engineconn import MeasuredUsage
from rm_server.domain.model import Ticket
from rm_server.errors import not_found
from rm_server.store.codec import (
    HISTORY_COLUMNS,
    TICKET_COLUMNS,
    ticket_from_history,
    ticket_from_json,
    ticket_from_row,
)
from rm_server.store.db import Conn, page_filters, page_rows


async def read_history(conn: Conn, ticket_id: str) -> Ticket | None:
    """An ended ticket as its history row recorded it; None when there is none."""
    cur = await conn.execute(
        f"SELECT {HISTORY_COLUMNS} FROM ticket_history WHERE ticket_id = %s",  # noqa: S608
        (ticket_id,),
    )
    row = await cur.fetchone()
    return None if row is None else ticket_from_history(row)


async def get_ticket(conn: Conn, ticket_id: str) -> Ticket:
    """A live ticket, else its history; NotFound when neither exists."""
    cur = await conn.execute(
        f"SELECT {TICKET_COLUMNS} FROM ticket WHERE ticket_id = %s",  # noqa: S608
        (ticket_id,),
    )
    row = await cur.fetchone()
    ticket = None if row is None else ticket_from_row(row)
    if ticket is None:
        ticket = await read_history(conn, ticket_id)
    if ticket is None:
        raise not_found("ticket", ticket_id)
    return ticket


async def measured_of(conn: Conn, ticket: Ticket) -> MeasuredUsage | None:
    """What an EngineConn's ticket's agent measured: its EngineConn's last measurement
    while the ticket is live, then what its history row kept (None for other tickets)."""
    if ticket.state.live and not ticket.engine_conn_id:
        return None
    if ticket.state.live:
        sql, key = "SELECT measured FROM engine_conn WHERE ec_id = %s", ticket.engine_conn_id
    else:
        sql, key = "SELECT measured FROM ticket_history WHERE ticket_id = %s", ticket.ticket_id
    row = await (await conn.execute(sql, (key,))).fetchone()
    return None if row is None or row[0] is None else MeasuredUsage.from_dict(row[0])


async def expired_ticket_ids(conn: Conn, now: datetime, limit: int) -> list[str]:
    """Up to `limit` LOCKED tickets whose lock expired by `now`, oldest expiry first."""
    cur = await conn.execute(
        "SELECT ticket_id FROM ticket WHERE state = 'LOCKED' AND lock_expires_at <= %s"
        " ORDER BY lock_expires_at LIMIT %s",
        (now, limit),
    )
    return [r[0] for r in await cur.fetchall()]


async def list_tickets(
    conn: Conn, after: str, limit: int, label: str, state: str, user: str | None = None
) -> list[Ticket]:
    """A page of live tickets in id order after `after`, filtered by label and state;
    with `user`, only that user's (the index `ticket (user_name, ticket_id)` serves it).
    An unnamed user sees nothing: an empty name must never read as "every user"."""
    if user == "":
        return []
    where, values = page_filters(
        ("user_name = %s", user),
        ("ticket_id > %s", after),
        ("charged_labels @> ARRAY[%s]::text[]", label),
        ("state = %s", state),
    )
    rows = await page_rows(
        conn,
        f"SELECT {TICKET_COLUMNS} FROM ticket WHERE {where}"  # noqa: S608
        " ORDER BY ticket_id LIMIT %s",
        (*values, limit),
        "ticket_id",
    )
    return [ticket_from_json(r) for r in rows]
