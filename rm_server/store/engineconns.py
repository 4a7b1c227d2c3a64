"""EngineConn rows and agent commands. Lock order, as everywhere (docs/architecture.md):
label rows (sorted), ticket row, ecm row, engine_conn row, agent_command rows."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from rm_server.domain.engineconn import (
    LIVE_STATES,
    AgentCommand,
    CommandKind,
    EcmChoiceRecord,
    EcState,
    EngineConn,
    LaunchPayload,
    MeasuredUsage,
    label_set,
)
from rm_server.domain.resources import Resource
from rm_server.errors import not_found
from rm_server.store.codec import jlabels, jres, labels_of, opt_res, res
from rm_server.store.db import Conn, Idempotency, page_filters
from rm_server.store.notify import agent_key, change_and_notify, ec_key

EC_COLUMNS = (
    "ec_id, state, user_name, labels, params, engine, resource, created_at, updated_at,"
    " ecm_instance, ticket_id, address, pid, exit_code, reason, log_tail, work_dir,"
    " ecm_choices, launch_attempts, holder, hold_expires_at, ready_at, ended_at, secret,"
    " granted, measured, measured_at"
)
LIVE = [s.value for s in LIVE_STATES]


def ec_from_row(row: tuple[Any, ...]) -> EngineConn:
    (ec_id, state, user, labels, params, engine, resource, created, updated, ecm, ticket,
     address, pid, exit_code, reason, log_tail, work_dir, choices, attempts, holder,
     hold_until, ready, ended, secret, granted, measured, measured_at) = row  # fmt: skip
    return EngineConn(
        ec_id=ec_id,
        state=EcState(state),
        user=user,
        labels=labels_of(labels),
        params=dict(params),
        engine=engine,
        resource=res(resource),
        created_at=created,
        updated_at=updated,
        ecm_instance=ecm or "",
        ticket_id=ticket or "",
        address=address,
        pid=pid or 0,
        exit_code=exit_code or 0,
        reason=reason,
        log_tail=log_tail,
        work_dir=work_dir,
        ecm_choices=tuple(
            EcmChoiceRecord(c["instance"], c["eligible"], c["score"], tuple(c["reasons"]))
            for c in choices
        ),
        launch_attempts=attempts,
        holder=holder,
        hold_expires_at=hold_until,
        ready_at=ready,
        ended_at=ended,
        secret=secret,
        granted=opt_res(granted),
        measured=MeasuredUsage.from_dict(measured) if measured is not None else None,
        measured_at=measured_at,
    )


async def claim_ec(conn: Conn, ec: EngineConn, idem: Idempotency) -> EngineConn:
    """Insert a new STARTING EngineConn for the request `idem`, or return the one that
    exists for it (the same caller, method and request id; InvalidArgument
    REQUEST_ID_REUSED when that caller sent a different request under the id)."""
    await conn.execute(
        "INSERT INTO engine_conn (ec_id, caller, request_method, request_id, request_hash,"
        " state, user_name, labels, label_set, params, engine, resource, created_at,"
        " updated_at, secret, holder, hold_expires_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (caller, request_method, request_id) DO NOTHING",
        (
            ec.ec_id,
            idem.caller,
            idem.method,
            idem.request_id,
            idem.request_hash,
            ec.state.value,
            ec.user,
            jlabels(ec.labels),
            label_set(ec.labels),
            Jsonb(dict(ec.params)),
            ec.engine,
            jres(ec.resource),
            ec.created_at,
            ec.updated_at,
            ec.secret,
            ec.holder,
            ec.hold_expires_at,
        ),
    )
    cur = await conn.execute(
        f"SELECT {EC_COLUMNS}, request_hash FROM engine_conn"  # noqa: S608
        " WHERE caller = %s AND request_method = %s AND request_id = %s",
        (idem.caller, idem.method, idem.request_id),
    )
    row = await cur.fetchone()
    assert row is not None
    found = ec_from_row(row[:-1])
    if found.ec_id != ec.ec_id:
        idem.check_same(bytes(row[-1]))
    return found


async def get_ec(conn: Conn, ec_id: str, *, lock: bool = False) -> EngineConn:
    sql = f"SELECT {EC_COLUMNS} FROM engine_conn WHERE ec_id = %s"  # noqa: S608
    cur = await conn.execute(sql + (" FOR UPDATE" if lock else ""), (ec_id,))
    row = await cur.fetchone()
    if row is None:
        raise not_found("EngineConn", ec_id)
    return ec_from_row(row)


@dataclass(frozen=True)
class EcBrief:
    """The few columns the report and heartbeat paths decide on (a whole row, with its
    labels, parameters and ranking, costs far more to read and decode)."""

    state: EcState
    ecm_instance: str
    ticket_id: str
    pid: int
    work_dir: str
    measured: MeasuredUsage | None
    # What `kill_of` reads: the state it was in when a kill was ordered, and the
    # reason (the kill's, once one was ordered).
    killed_from: EcState | None = None
    reason: str = ""

    @property
    def kill(self) -> tuple[EcState, str] | None:
        """`kill_of`'s answer, as of this read."""
        return (self.killed_from, self.reason) if self.killed_from is not None else None


async def brief_ec(conn: Conn, ec_id: str, *, lock: bool = False) -> EcBrief | None:
    """The EngineConn's `EcBrief` (row-locked with `lock`); None when there is none."""
    query = "SELECT state, ecm_instance, ticket_id, pid, work_dir, measured, killed_from,"
    query += " reason FROM engine_conn WHERE ec_id = %s"
    cur = await conn.execute(query + (" FOR UPDATE" if lock else ""), (ec_id,))
    row = await cur.fetchone()
    if row is None:
        return None
    state, ecm, ticket, pid, work_dir, measured, killed_from, reason = row
    return EcBrief(
        EcState(state),
        ecm or "",
        ticket or "",
        pid or 0,
        work_dir,
        MeasuredUsage.from_dict(measured) if measured is not None else None,
        EcState(killed_from) if killed_from is not None else None,
        reason or "",
    )


async def list_ecs(
    conn: Conn, after: str, limit: int, user: str, state: str, ecm: str
) -> list[EngineConn]:
    """A page of EngineConns in id order after `after`, filtered by user, state, ECM."""
    where, values = page_filters(
        ("ec_id > %s", after),
        ("user_name = %s", user),
        ("state = %s", state),
        ("ecm_instance = %s", ecm),
    )
    cur = await conn.execute(
        f"SELECT {EC_COLUMNS} FROM engine_conn WHERE {where}"  # noqa: S608
        " ORDER BY ec_id LIMIT %s",
        (*values, limit),
    )
    return [ec_from_row(r) for r in await cur.fetchall()]


async def live_ecs_on(conn: Conn, ecm: str) -> list[EngineConn]:
    cur = await conn.execute(
        f"SELECT {EC_COLUMNS} FROM engine_conn"  # noqa: S608
        " WHERE ecm_instance = %s AND state = ANY(%s) ORDER BY ec_id",
        (ecm, LIVE),
    )
    return [ec_from_row(r) for r in await cur.fetchall()]


async def update_ec(
    conn: Conn,
    ec_id: str,
    now: datetime,
    *,
    notify: bool = True,
    only_if: AbstractSet[EcState] | None = None,
    **fields: Any,
) -> bool:
    """Set the named columns (fixed whitelist, values as parameters), and wake those
    waiting on the EngineConn (`notify`). `only_if`: only while it is in one of these
    states (checked on the row as locked by the update). True when a row was changed."""
    allowed = {
        "state",
        "ecm_instance",
        "ticket_id",
        "address",
        "pid",
        "exit_code",
        "reason",
        "log_tail",
        "work_dir",
        "ecm_choices",
        "launch_attempts",
        "holder",
        "hold_expires_at",
        "launched_at",
        "ready_at",
        "last_report_at",
        "ended_at",
        "granted",
        "measured",
        "measured_at",
    }
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"not an engine_conn column: {sorted(unknown)}")
    if only_if is not None and not only_if:
        return False
    names = sorted(fields)
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = %s").format(sql.Identifier(name)) for name in names
    )
    values = [_column_value(fields[n]) for n in names]
    guard = sql.SQL(" AND state = ANY(%s)" if only_if is not None else "")
    change = sql.SQL("UPDATE engine_conn SET {}, updated_at = %s WHERE ec_id = %s{}").format(
        assignments, guard
    )
    states = [[s.value for s in only_if]] if only_if is not None else []
    params = (*values, now, ec_id, *states)
    return await change_and_notify(conn, change, params, ec_key(ec_id), notify) > 0


async def record_report(conn: Conn, ec_id: str, state: EcState | None, arrived: datetime) -> bool:
    """Record an EngineConn's own report that reached the RM at `arrived`: its state (None:
    unchanged) and when it was heard, unless a report that reached the RM later is recorded
    already. A report its EngineConn gave up waiting for (its call's deadline passed) may
    still be running here while the next one is answered; applied after it, the stale state
    (BUSY when the execution has ended) would stand until the next report. True when
    recorded."""
    change = sql.SQL(
        "UPDATE engine_conn SET state = coalesce(%s::text, state),"
        " last_report_at = %s, updated_at = %s"
        " WHERE ec_id = %s AND (last_report_at IS NULL OR last_report_at <= %s)"
    )
    params = (None if state is None else state.value, arrived, arrived, ec_id, arrived)
    # Recorded or not, and the notification of a new state, in one round trip.
    return await change_and_notify(conn, change, params, ec_key(ec_id), state is not None) > 0


def _column_value(value: Any) -> Any:
    if isinstance(value, EcState):
        return value.value
    if isinstance(value, (Resource, MeasuredUsage)):
        return Jsonb(value.to_dict())
    return value


async def record_usage(
    conn: Conn, measured: Sequence[tuple[str, str, MeasuredUsage]], now: datetime
) -> None:
    """Store agents' measurements, (agent id, EngineConn id, usage) each, in one statement:
    only on live EngineConns of that agent (an agent speaks for its own only). The
    memory samples are integrated as they come (`measured_memory`, byte x us: the
    previous sample held until this one), for the usage ledger's memory-seconds."""
    if not measured:
        return
    await conn.execute(
        "UPDATE engine_conn AS c SET measured = m.usage, measured_at = %s,"
        " measured_memory = c.measured_memory + coalesce((c.measured->>'memory_bytes')::numeric"
        "   * greatest(0, round(extract(epoch FROM %s - c.measured_at) * 1000000)), 0)"
        " FROM unnest(%s::text[], %s::text[], %s::jsonb[]) AS m(agent_id, ec_id, usage)"
        " WHERE c.ec_id = m.ec_id AND c.ecm_instance = m.agent_id AND c.state = ANY(%s)",
        (
            now,
            now,
            [a for a, _, _ in measured],
            [e for _, e, _ in measured],
            [Jsonb(u.to_dict()) for _, _, u in measured],
            LIVE,
        ),
    )


# A live EngineConn silent since %(silent)s, or STARTING since before %(start)s.
SILENT_EC_SQL = (
    "((state IN ('IDLE', 'BUSY', 'SHUTTING_DOWN')"
    "  AND coalesce(last_report_at, ready_at, updated_at) < %(silent)s)"
    " OR (state = 'STARTING' AND coalesce(launched_at, created_at) < %(start)s))"
)


async def silent_ecs(conn: Conn, silent_since: datetime, start_limit: datetime) -> list[EngineConn]:
    """Live EngineConns silent since `silent_since`, or STARTING since before `start_limit`."""
    cur = await conn.execute(
        f"SELECT {EC_COLUMNS} FROM engine_conn WHERE {SILENT_EC_SQL} ORDER BY ec_id",  # noqa: S608
        {"silent": silent_since, "start": start_limit},
    )
    return [ec_from_row(r) for r in await cur.fetchall()]


async def is_silent(conn: Conn, ec_id: str, silent_since: datetime, start_limit: datetime) -> bool:
    """Whether EngineConn `ec_id` is still as `silent_ecs` found it (checked again under
    its row lock: a report may have come in since)."""
    cur = await conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM engine_conn WHERE ec_id = %(ec)s AND {SILENT_EC_SQL})",  # noqa: S608
        {"ec": ec_id, "silent": silent_since, "start": start_limit},
    )
    row = await cur.fetchone()
    return bool(row and row[0])


def choices_json(choices: Sequence[EcmChoiceRecord]) -> Jsonb:
    return Jsonb(
        [
            {
                "instance": c.instance,
                "eligible": c.eligible,
                "score": c.score,
                "reasons": list(c.reasons),
            }
            for c in choices
        ]
    )


async def take_reusable(
    conn: Conn, user: str, labels: str, holder: str, hold_until: datetime, now: datetime
) -> EngineConn | None:
    """Hold an IDLE EngineConn of this user and label set for `holder`, if there is one."""
    cur = await conn.execute(
        f"SELECT {EC_COLUMNS} FROM engine_conn"  # noqa: S608
        " WHERE user_name = %s AND label_set = %s AND state = 'IDLE'"
        " AND (hold_expires_at IS NULL OR hold_expires_at <= %s)"
        " ORDER BY ready_at LIMIT 1 FOR UPDATE SKIP LOCKED",
        (user, labels, now),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    ec = ec_from_row(row)
    await conn.execute(
        "UPDATE engine_conn SET holder = %s, hold_expires_at = %s, updated_at = %s"
        " WHERE ec_id = %s",
        (holder, hold_until, now, ec.ec_id),
    )
    return ec


async def set_hold(conn: Conn, ec_id: str, holder: str, hold_until: datetime) -> None:
    """Move the end of ``holder``'s hold on an EngineConn (a hold another took is kept)."""
    await conn.execute(
        "UPDATE engine_conn SET hold_expires_at = %s WHERE ec_id = %s AND holder = %s",
        (hold_until, ec_id, holder),
    )


# ----- agent commands -------------------------------------------------------------------


def _payload(cmd: AgentCommand) -> dict[str, Any]:
    out: dict[str, Any] = {"reason": cmd.reason, "grace_seconds": cmd.grace_seconds}
    if cmd.launch is not None:
        lp = cmd.launch
        out["launch"] = {
            "user": lp.user,
            "engine_type": lp.engine_type,
            "program": lp.program,
            "argv": list(lp.argv),
            "environment": dict(lp.environment),
            "required_local_environment": list(lp.required_local_environment),
            "material_files": [
                [name, base64.b64encode(content).decode(), executable]
                for name, content, executable in lp.material_files
            ],
            "memory_bytes": lp.memory_bytes,
            "cpu_millis": lp.cpu_millis,
        }
    return out


def command_from_row(row: tuple[Any, ...]) -> AgentCommand:
    command_id, agent_id, ec_id, kind, payload = row
    launch = None
    if "launch" in payload:
        lp = payload["launch"]
        launch = LaunchPayload(
            user=lp["user"],
            engine_type=lp["engine_type"],
            program=lp["program"],
            argv=tuple(lp["argv"]),
            environment=dict(lp["environment"]),
            required_local_environment=tuple(lp["required_local_environment"]),
            material_files=tuple(
                (name, base64.b64decode(content), bool(executable))
                for name, content, executable in lp["material_files"]
            ),
            memory_bytes=int(lp.get("memory_bytes", 0)),
            cpu_millis=int(lp.get("cpu_millis", 0)),
        )
    return AgentCommand(
        command_id,
        agent_id,
        ec_id,
        CommandKind(kind),
        launch,
        payload.get("reason", ""),
        float(payload.get("grace_seconds", 0.0)),
    )


async def queue_command(
    conn: Conn, cmd: AgentCommand, now: datetime, *, unless_pending: bool = False
) -> None:
    """Queue a command for its agent and wake the agent's stream, in one round trip.
    `unless_pending`: not if a command of the same kind for the same EngineConn is
    still pending (a kill or a clean-up is ordered once)."""
    guard = (
        " WHERE NOT EXISTS (SELECT 1 FROM agent_command WHERE agent_id = %s"
        " AND ec_id = %s AND kind = %s AND done_at IS NULL)"
        if unless_pending
        else ""
    )
    change = sql.SQL(
        "INSERT INTO agent_command (command_id, agent_id, ec_id, kind, payload, created_at)"
        " SELECT %s, %s, %s, %s, %s, %s{} ON CONFLICT (command_id) DO NOTHING"
    ).format(sql.SQL(guard))
    row = (cmd.command_id, cmd.agent_id, cmd.ec_id, cmd.kind.value, Jsonb(_payload(cmd)), now)
    params = (*row, cmd.agent_id, cmd.ec_id, cmd.kind.value) if unless_pending else row
    await change_and_notify(conn, change, params, agent_key(cmd.agent_id))


async def pending_commands(
    conn: Conn, agent_id: str, sent: AbstractSet[str] = frozenset()
) -> list[AgentCommand]:
    """The agent's pending commands in the order they were queued. Those in `sent`
    (already streamed to it) come without their payload: the caller has them, and a
    launch's payload (its files and environment) is the costly part to read again."""
    cur = await conn.execute(
        "SELECT command_id, agent_id, ec_id, kind,"
        " CASE WHEN command_id = ANY(%s) THEN NULL ELSE payload END FROM agent_command"
        " WHERE agent_id = %s AND done_at IS NULL ORDER BY created_at, command_id",
        (list(sent), agent_id),
    )
    return [
        AgentCommand(r[0], r[1], r[2], CommandKind(r[3])) if r[4] is None else command_from_row(r)
        for r in await cur.fetchall()
    ]


async def launch_done_before(conn: Conn, agent_id: str, before: datetime) -> set[str]:
    """EngineConn ids whose launch the agent acknowledged before `before`."""
    cur = await conn.execute(
        "SELECT ec_id FROM agent_command WHERE agent_id = %s AND kind = 'launch'"
        " AND done_at IS NOT NULL AND done_at < %s",
        (agent_id, before),
    )
    return {r[0] for r in await cur.fetchall()}


async def purge_done_commands(conn: Conn, done_before: datetime) -> int:
    """Acknowledged commands are kept a while for `launch_done_before`, then dropped."""
    cur = await conn.execute(
        "DELETE FROM agent_command WHERE done_at IS NOT NULL AND done_at < %s", (done_before,)
    )
    return cur.rowcount


async def mark_shutting_down(
    conn: Conn, ec_id: str, killed_from: EcState, reason: str, now: datetime
) -> None:
    """A kill was ordered: SHUTTING_DOWN with its reason, and the state it was in when
    the first kill was ordered (`kill_of`), with the wake-up, in one round trip."""
    change = sql.SQL(
        "UPDATE engine_conn SET state = %s, reason = %s,"
        " killed_from = coalesce(killed_from, %s), updated_at = %s WHERE ec_id = %s"
    )
    params = (EcState.SHUTTING_DOWN.value, reason, killed_from.value, now, ec_id)
    await change_and_notify(conn, change, params, ec_key(ec_id))


async def kill_of(conn: Conn, ec_id: str) -> tuple[EcState, str] | None:
    """(the state it was in when a kill was ordered, the kill's reason); None when no kill
    was ordered."""
    brief = await brief_ec(conn, ec_id)
    return brief.kill if brief is not None else None


async def keep_measured(conn: Conn, ticket_id: str, ec_id: str, usage: MeasuredUsage) -> None:
    """An ended EngineConn's last measurement and its memory integral, kept on its
    ticket's history row (written in the transaction that released the ticket: the
    usage ledger reads them there)."""
    await conn.execute(
        "UPDATE ticket_history SET measured = %s,"
        " measured_memory = (SELECT measured_memory FROM engine_conn WHERE ec_id = %s)"
        " WHERE ticket_id = %s",
        (Jsonb(usage.to_dict()), ec_id, ticket_id),
    )
