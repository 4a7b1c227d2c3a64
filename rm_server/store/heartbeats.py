"""Agent heartbeats, many per transaction.

A group of heartbeats (of distinct agents) costs two round trips whatever its size:

1. one statement: the ECM rows, locked in canonical order (instance), each with the
   agent's live EngineConns, acknowledged launches and pending commands, and the
   node lists;
2. (pipelined with COMMIT) one UPDATE recording every beat's liveness, sequence number
   and stored answer, one storing what the agents measured their EngineConns using (when
   a beat carries a measurement), and one UPDATE marking the commands the beats
   acknowledged.

What each beat is answered is decided in between by rm_server/app/agents.py, from what
round trip 1 read. Lock order as everywhere (docs/architecture.md): label rows, ticket
rows, ecm rows, engine_conn rows, agent_command rows (a beat takes none before the ECMs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rm_server.domain.engineconn import AgentCommand, EcmState, MeasuredUsage
from rm_server.store.db import Conn
from rm_server.store.ecms import NodeLists
from rm_server.store.engineconns import LIVE, command_from_row, record_usage

# How much older than an ECM's last heartbeat its `beat_mark` (the liveness sweep's
# index) may be: with beats every 3 s, one beat in about four rewrites it.
BEAT_MARK_SLACK = timedelta(seconds=10)


@dataclass
class AgentSeen:
    """One agent as round trip 1 found it."""

    state: EcmState
    heartbeat_seq: int
    last_response: bytes | None
    live_pids: dict[str, int] = field(default_factory=dict)  # live EngineConn -> pid
    acked: set[str] = field(default_factory=set)  # launches acknowledged before now
    pending: list[AgentCommand] = field(default_factory=list)


@dataclass(frozen=True)
class Seen:
    agents: dict[str, AgentSeen]  # registered agents only
    node_lists: NodeLists


@dataclass(frozen=True)
class BeatWrite:
    """What a fresh heartbeat records: its sequence number and, when it was answered
    in the group, that answer (a resend of the same sequence gets it back)."""

    agent_id: str
    sequence: int
    response: bytes | None
    done_command_ids: Sequence[str] = ()
    # What the agent measured its running EngineConns using: (EngineConn id, usage).
    measured: Sequence[tuple[str, MeasuredUsage]] = ()


# One row per registered agent, locked in canonical order, with what the answer needs:
# its live EngineConns (id, pid), the launches it acknowledged before this group, its
# pending commands in queue order, and (the same on every row) the node lists.
LOAD_SQL = """
SELECT e.instance, e.state, e.heartbeat_seq, e.last_response,
  ARRAY(SELECT c.ec_id FROM engine_conn c
        WHERE c.ecm_instance = e.instance AND c.state = ANY(%(live)s) ORDER BY c.ec_id),
  ARRAY(SELECT coalesce(c.pid, 0) FROM engine_conn c
        WHERE c.ecm_instance = e.instance AND c.state = ANY(%(live)s) ORDER BY c.ec_id),
  ARRAY(SELECT a.ec_id FROM agent_command a
        WHERE a.agent_id = e.instance AND a.kind = 'launch'
          AND a.done_at IS NOT NULL AND a.done_at < %(now)s),
  (SELECT jsonb_agg(jsonb_build_array(a.command_id, a.agent_id, a.ec_id, a.kind, a.payload)
                    ORDER BY a.created_at, a.command_id)
   FROM agent_command a WHERE a.agent_id = e.instance AND a.done_at IS NULL),
  ARRAY(SELECT n.list || ':' || n.entry FROM node_list n)
FROM ecm e WHERE e.instance = ANY(%(ids)s) ORDER BY e.instance FOR UPDATE OF e
"""


async def load(conn: Conn, agent_ids: Sequence[str], now: datetime) -> Seen:
    """Round trip 1: lock and read the agents' rows (one statement)."""
    cur = await conn.execute(LOAD_SQL, {"ids": sorted(set(agent_ids)), "live": LIVE, "now": now})
    agents: dict[str, AgentSeen] = {}
    lists: list[tuple[str, str]] | None = None
    for instance, state, seq, response, live, pids, acked, pending, entries in await cur.fetchall():
        if lists is None:  # the same on every row: parsed once
            lists = [(kind, value) for kind, _, value in (e.partition(":") for e in entries)]
        agents[instance] = AgentSeen(
            EcmState(state),
            seq,
            bytes(response) if response is not None else None,
            dict(zip(live, pids, strict=True)),
            set(acked),
            [command_from_row(tuple(row)) for row in pending or ()],
        )
    return Seen(agents, NodeLists.of_rows(lists or []))


async def record(conn: Conn, writes: Sequence[BeatWrite], now: datetime) -> None:
    """Round trip 2 (no fetch: the COMMIT that follows carries it): liveness, sequence
    numbers, stored answers, acknowledged commands."""
    if not writes:
        return
    await conn.execute(
        "UPDATE ecm AS e SET last_heartbeat_at = %s, heartbeat_seq = b.seq,"
        " last_response = b.response,"
        # Renewed only when older than the slack: the other beats leave every indexed
        # column as it was, and the row is updated in place (a heap-only update).
        " beat_mark = CASE WHEN e.beat_mark IS NULL OR e.beat_mark < %s THEN %s"
        " ELSE e.beat_mark END"
        " FROM unnest(%s::text[], %s::bigint[], %s::bytea[]) AS b(instance, seq, response)"
        " WHERE e.instance = b.instance",
        (
            now,
            now - BEAT_MARK_SLACK,
            now,
            [w.agent_id for w in writes],
            [w.sequence for w in writes],
            [w.response for w in writes],
        ),
    )
    measured = [(w.agent_id, ec_id, usage) for w in writes for ec_id, usage in w.measured]
    await record_usage(conn, measured, now)  # engine_conn rows before agent_command rows
    done = [(w.agent_id, c) for w in writes for c in w.done_command_ids]
    if done:
        await conn.execute(
            "UPDATE agent_command AS c SET done_at = %s"
            " FROM unnest(%s::text[], %s::text[]) AS d(agent_id, command_id)"
            " WHERE c.agent_id = d.agent_id AND c.command_id = d.command_id"
            " AND c.done_at IS NULL",
            (now, [a for a, _ in done], [c for _, c in done]),
        )
