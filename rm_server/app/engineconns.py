"""The EngineConn start-up flow of the Apache Linkis EngineConn design, on top of RMCore.

CreateEngineConn: validate -> engine plugin's resource factory -> rank ECMs (pure
rules, reasons kept) -> for the best ECM: Apply on the request's labels plus its
emInstance label, and queue the launch command in the SAME transaction -> the
agent launches through sudo -> the EngineConn's first IDLE report is "ready"
(its ticket turns USED) -> return its address. A failed launch releases the
ticket and the next ECM is tried, a bounded number of times.

No gRPC and no SQL here: the store runs the transactions, the servicers convert.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from rm_server.app.core import RMCore
from rm_server.domain.engineconn import (
    AgentCommand,
    CommandKind,
    EcmChoiceRecord,
    EcmStatus,
    EcState,
    EngineConn,
    LaunchPayload,
    label_set,
    local_limits,
)
from rm_server.domain.labels import EM_INSTANCE, ENGINE_TYPE, USER_CREATOR, Label
from rm_server.domain.liveness import DEFAULT_DISRUPTION_MIN_AGENTS, DEFAULT_DISRUPTION_SHARE
from rm_server.domain.model import Ticket
from rm_server.domain.resources import Resource
from rm_server.domain.selection import EcmCandidate, SelectionRequest, rank
from rm_server.engines import LaunchContext, plugin_for
from rm_server.errors import (
    DeadlineExceeded,
    EcmNotRegistered,
    EcmNotRunning,
    FailedPrecondition,
    InvalidArgument,
    LabelrmError,
    ResourceExhausted,
    as_rm_error,
)
from rm_server.store import ecms as ecm_store
from rm_server.store import engineconns as ec_store
from rm_server.store import tickets as ticket_store
from rm_server.store.db import Conn, Idempotency, Replay
from rm_server.store.ecms import NodeLists
from rm_server.store.notify import agent_key, ec_key

log = logging.getLogger(__name__)

# The launch variable carrying the executor secret (engineconn/runtime.py reads it; the
# agent passes it through, as it reserves only the names it sets itself).
EC_SECRET_ENV = "LABELRM_EC_SECRET"
# The YARN queue (full path) the RM admitted an EngineConn's yarn part in, if it has one.
YARN_QUEUE_ENV = "LABELRM_YARN_QUEUE"


@dataclass(frozen=True)
class EcSettings:
    create_timeout: float = 60.0
    max_launch_attempts: int = 3
    ecm_expiry: timedelta = timedelta(seconds=30)
    ec_expiry: timedelta = timedelta(seconds=30)
    agent_heartbeat_interval: float = 3.0
    ec_heartbeat_interval: float = 3.0
    kill_grace: float = 5.0
    hold: timedelta = timedelta(seconds=60)
    standby_window: timedelta = timedelta(seconds=0)
    engine_defaults: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Only ECMs the node include list names are allowed (none while it is empty).
    node_include_required: bool = False
    # A suspected disruption: at least this share of the agents, and this many, silent at
    # once (domain/liveness.py).
    disruption_share: float = DEFAULT_DISRUPTION_SHARE
    disruption_min_agents: int = DEFAULT_DISRUPTION_MIN_AGENTS

    @property
    def start_timeout(self) -> timedelta:
        """A STARTING EngineConn older than this failed to start (create gave up on it)."""
        return timedelta(seconds=self.create_timeout + 30)


class _TicketIdEncoder:
    """Request-log encoding for the internal Apply of a launch attempt."""

    def ok(self, result: Ticket) -> bytes:
        return result.ticket_id.encode()

    def error(self, err: LabelrmError) -> tuple[int, bytes]:
        return 1, err.message.encode()


@dataclass(frozen=True)
class CreateRequest:
    idem: Idempotency  # the caller's key: a retry gets its own EngineConn, nobody else's
    user: str
    labels: tuple[Label, ...]
    params: Mapping[str, str]
    timeout: float

    @property
    def request_id(self) -> str:
        return self.idem.request_id


class LaunchCredentials(Protocol):
    """Per-launch credentials (rm_server.security.ec_certs): material files plus the
    environment naming them."""

    @property
    def files(self) -> tuple[tuple[str, bytes, bool], ...]: ...

    @property
    def environment(self) -> Mapping[str, str]: ...


class EngineConnManager:
    """EngineConn use cases; the heartbeat and liveness side lives in `rm_server.app.agents`."""

    def __init__(
        self,
        core: RMCore,
        settings: EcSettings,
        credentials: Callable[[str], LaunchCredentials] | None = None,
    ) -> None:
        self.core = core
        self.db = core.db
        self.settings = settings
        # Issues each EngineConn its TLS client certificate (None: no issuing CA).
        self.credentials = credentials

    # ----- create / ask ------------------------------------------------------------------

    def _validate(self, req: CreateRequest) -> tuple[str, str, str]:
        by_key = {label.key: label for label in req.labels}
        creator, engine_type = by_key.get(USER_CREATOR), by_key.get(ENGINE_TYPE)
        if creator is None or engine_type is None:
            raise InvalidArgument("labels", "userCreator and engineType labels are required")
        if req.user and req.user != creator.user:
            raise InvalidArgument(
                "user", f"must match the userCreator label's user {creator.user!r}"
            )
        return creator.user, engine_type.engine, engine_type.version

    async def create(self, req: CreateRequest, hold: timedelta | None = None) -> EngineConn:
        """Start a new EngineConn and wait until it is ready; see the module docstring.

        With ``hold`` (AskEngineConn), the EngineConn is held for the request from its
        creation (so no other Ask can take it once it turns IDLE) until ``hold`` after it
        is ready, exactly like an EngineConn that Ask reused.
        """
        user, engine, version = self._validate(req)
        # Bad params raise InvalidParam, naming the field: INVALID_ARGUMENT (as_rm_error).
        plugin = plugin_for(engine)
        defaults = self.settings.engine_defaults.get(engine, {})
        resource = plugin.resource(req.params, defaults)
        params = plugin.params(req.params, defaults)
        now = self.core.clock.now()
        fresh = EngineConn(
            ec_id=self.core.new_id("ec"),
            state=EcState.STARTING,
            user=user,
            labels=req.labels,
            params=params,
            engine=engine,
            resource=resource,
            created_at=now,
            updated_at=now,
            # 32 random bytes: its ExecutorService serves only callers that present it.
            secret=secrets.token_urlsafe(32),
        )
        if hold is not None:  # held while it starts; the hold counts from when it is ready
            start_limit = timedelta(seconds=req.timeout) + self.settings.start_timeout
            fresh = replace(fresh, holder=req.request_id, hold_expires_at=now + start_limit + hold)

        # A retry of the same request (same caller, method and id) gets the first claim's
        # row, secret included; another caller's id is another request.
        async def claim(conn: Conn) -> tuple[EngineConn, _Candidates]:
            # The ECMs are read in the claim's transaction: the first ranking costs none.
            return await ec_store.claim_ec(conn, fresh, req.idem), await _read_candidates(conn)

        ec, candidates = await self.db.run(claim)
        deadline = time.monotonic() + req.timeout
        if ec.ec_id != fresh.ec_id:  # a retry of a request already under way
            return await self._outcome_of(ec.ec_id, deadline)
        try:
            ready = await self._launch_attempts(
                ec, user, engine, version, resource, deadline, candidates
            )
        except BaseException as exc:
            await self._fail_if_starting(ec.ec_id, start_failure_reason(exc))
            raise
        if hold is None:
            return ready
        until = self.core.clock.now() + hold
        await self.db.run(lambda c: ec_store.set_hold(c, ec.ec_id, req.request_id, until))
        return replace(ready, holder=req.request_id, hold_expires_at=until)

    async def ask(self, req: CreateRequest, hold: float) -> tuple[EngineConn, bool]:
        """Reuse an IDLE EngineConn of the same user and labels (held for the caller)."""
        user, _, _ = self._validate(req)
        now = self.core.clock.now()
        length = timedelta(seconds=hold) if hold > 0 else self.settings.hold
        until = now + length
        reused = await self.db.run(
            lambda c: ec_store.take_reusable(
                c, user, label_set(req.labels), req.request_id, until, now
            )
        )
        if reused is not None:
            return replace(reused, holder=req.request_id, hold_expires_at=until), True
        return await self.create(req, hold=length), False

    async def _launch_attempts(
        self,
        ec: EngineConn,
        user: str,
        engine: str,
        version: str,
        resource: Resource,
        deadline: float,
        candidates: _Candidates | None = None,
    ) -> EngineConn:
        """Launch on the best ECM, then the next best while launches fail
        (`candidates`: the ECMs as read with the claim, for the first ranking)."""
        tried: set[str] = set()
        failures: list[str] = []
        last_error: LabelrmError | None = None
        for attempt in range(self.settings.max_launch_attempts):
            if candidates is None:
                candidates = await self.db.run(_read_candidates)
            choices = self._ranked(candidates, ec.labels, resource)
            candidates = None  # each later attempt reads them again
            pick = next(
                (c.instance for c in choices if c.eligible and c.instance not in tried), None
            )
            if pick is None:
                await self._store_choices(ec.ec_id, choices)
                break
            tried.add(pick)
            # Subscribed before the launch is queued, this attempt hears every change
            # after it: the row is STARTING without a pid until one arrives.
            with self.core.notifier.subscribe([ec_key(ec.ec_id)]) as changed:
                try:
                    # The ranking is stored with the launch, in its transaction.
                    await self._apply_and_launch(
                        ec, pick, attempt, user, engine, version, resource, choices
                    )
                # Lost a race for that ECM (its capacity taken, or it went away): the next.
                except (ResourceExhausted, EcmNotRegistered, EcmNotRunning) as exc:
                    await self._store_choices(ec.ec_id, choices)  # that one rolled back
                    last_error = exc
                    failures.append(f"{pick}: {exc.message}")
                    continue
                outcome = await self._await_ready(ec.ec_id, deadline, changed)
            if outcome.state in (EcState.IDLE, EcState.BUSY):
                return outcome
            failures.append(f"{pick}: {outcome.reason}")
            last_error = FailedPrecondition(
                f"EngineConn {ec.ec_id} failed to start on {pick}: {outcome.reason}"
                + (f"\n{outcome.log_tail}" if outcome.log_tail else ""),
                state=outcome.state.value,
                reason="LAUNCH_FAILED",
            )
        if last_error is not None:
            if len(failures) > 1:
                last_error.message += " (attempts: " + "; ".join(failures) + ")"
            raise last_error
        raise _no_ecm(
            ec.ec_id, self._ranked(await self.db.run(_read_candidates), ec.labels, resource)
        )

    async def _store_choices(self, ec_id: str, choices: list[EcmChoiceRecord]) -> None:
        await self.db.run(
            lambda c: ec_store.update_ec(
                c, ec_id, self.core.clock.now(), ecm_choices=ec_store.choices_json(choices)
            )
        )

    def _ranked(
        self, read: _Candidates, labels: tuple[Label, ...], resource: Resource
    ) -> list[EcmChoiceRecord]:
        """The ECMs as read (`_read_candidates`), ranked for this request."""
        statuses, lists = read
        now = self.core.clock.now()
        candidates = [
            EcmCandidate(
                instance=s.instance,
                labels=s.labels,
                state=s.state.value,
                allowed=lists.allows(s.instance, self.settings.node_include_required),
                last_heartbeat=s.last_heartbeat_at,
                registered_at=s.registered_at,
                total=s.total,
                left=s.left if s.left is not None else s.total,
                live_engine_conns=s.live_engine_conns,
                cordoned=s.cordoned,
            )
            for s in statuses
        ]
        request = SelectionRequest(
            labels,
            resource,
            now,
            heartbeat_expiry=self.settings.ecm_expiry,
            standby_window=self.settings.standby_window,
        )
        return [
            EcmChoiceRecord(c.instance, c.eligible, c.score, c.reasons)
            for c in rank(candidates, request)
        ]

    async def _apply_and_launch(
        self,
        ec: EngineConn,
        ecm: str,
        attempt: int,
        user: str,
        engine: str,
        version: str,
        resource: Resource,
        choices: list[EcmChoiceRecord],
    ) -> None:
        # Bad params raise InvalidParam, naming the field: INVALID_ARGUMENT (as_rm_error).
        launch = plugin_for(engine).launch(
            LaunchContext(ec.ec_id, user, engine, version, ec.labels, ec.params)
        )
        files = tuple((m.name, m.content, m.executable) for m in launch.material_files)
        environment = dict(launch.environment)
        if self.credentials is not None:
            creds = self.credentials(ec.ec_id)
            files += creds.files
            environment.update(creds.environment)
        # Set last, so that nothing a plugin or the credentials put there can replace it.
        environment[EC_SECRET_ENV] = ec.secret
        command = AgentCommand(
            command_id=self.core.new_id("cmd"),
            agent_id=ecm,
            ec_id=ec.ec_id,
            kind=CommandKind.LAUNCH,
            launch=LaunchPayload(
                user=user,
                engine_type=f"{engine}-{version}",
                program=launch.program,
                argv=launch.argv,
                environment=environment,
                required_local_environment=launch.required_local_environment,
                material_files=files,
            ),
        )

        async def queue_launch(conn: Conn, ticket: Ticket) -> None:
            now = self.core.clock.now()
            # Still STARTING: nobody waiting on it needs waking (notify=False).
            await ec_store.update_ec(
                conn,
                ec.ec_id,
                now,
                notify=False,
                state=EcState.STARTING,
                ecm_instance=ecm,
                ticket_id=ticket.ticket_id,
                launch_attempts=attempt + 1,
                launched_at=now,
                reason="",
                log_tail="",
                exit_code=None,
                pid=None,
                ecm_choices=ec_store.choices_json(choices),
                granted=ticket.locked,
            )
            launch_command = with_grant(with_admitted_queue(command, ticket), ticket)
            await ec_store.queue_command(conn, launch_command, now)

        labels = (*[lb for lb in ec.labels if lb.key != EM_INSTANCE], Label(EM_INSTANCE, ecm))
        idem = Idempotency.of("CreateEngineConn.Apply", f"{ec.ec_id}/{attempt}", b"")
        outcome = await self.core.tickets.apply(
            idem,
            user,
            labels,
            resource,
            0.0,
            _TicketIdEncoder(),
            after=queue_launch,
            engine_conn_id=ec.ec_id,
        )
        if isinstance(outcome, Replay):  # pragma: no cover - attempt ids are unique
            raise FailedPrecondition("launch attempt already made", state="STARTING")

    async def _await_ready(
        self, ec_id: str, deadline: float, launched: asyncio.Event | None = None
    ) -> EngineConn:
        """Wait for the EngineConn to leave STARTING (woken by NOTIFY ec:<id>).

        Ready takes two reports: the EngineConn's own (IDLE, with its address) and its
        agent's heartbeat with the process (pid, work dir). Either may come first: a fork
        from a warm fork server reports IDLE before the agent's next heartbeat.
        `launched`: the caller's subscription, taken before it queued the launch; the
        row is read only once it changed since (no read of a row known to be STARTING).
        """
        if launched is None:
            with self.core.notifier.subscribe([ec_key(ec_id)]) as changed:
                changed.set()  # not known: read it first
                return await self._await_ready(ec_id, deadline, changed)
        while True:
            remaining = deadline - time.monotonic()
            if not launched.is_set() and remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(launched.wait(), timeout=remaining)
            launched.clear()
            ec = await self.db.run(ec_store.get_ec, ec_id, one_statement=True)
            up = ec.state in (EcState.IDLE, EcState.BUSY)
            if ec.state is not EcState.STARTING and (ec.pid or not up):
                return ec
            if deadline - time.monotonic() <= 0:
                await self.kill(ec_id, "start timeout")
                raise DeadlineExceeded(f"EngineConn {ec_id} was not ready within the timeout")

    async def _outcome_of(self, ec_id: str, deadline: float) -> EngineConn:
        ec = await self._await_ready(ec_id, deadline)
        if ec.state in (EcState.IDLE, EcState.BUSY):
            return ec
        raise FailedPrecondition(
            f"EngineConn {ec_id} is {ec.state.value}: {ec.reason}",
            state=ec.state.value,
            reason="LAUNCH_FAILED",
        )

    async def _fail_if_starting(self, ec_id: str, reason: str) -> None:
        async def body(conn: Conn) -> None:
            ec = await ec_store.get_ec(conn, ec_id)
            if ec.state is not EcState.STARTING:
                return
            now = self.core.clock.now()
            if ec.ticket_id:
                await ticket_store.release(conn, ec.ticket_id, now, "EngineConn failed to start")
            await ec_store.update_ec(
                conn, ec_id, now, state=EcState.FAILED, ended_at=now, reason=ec.reason or reason
            )

        await asyncio.shield(self.db.run(body))

    # ----- queries and kill ----------------------------------------------------------------

    async def get(self, ec_id: str) -> EngineConn:
        return await self.db.run(ec_store.get_ec, ec_id, one_statement=True)

    async def list(
        self, after: str, limit: int, user: str, state: str, ecm: str
    ) -> list[EngineConn]:
        return await self.db.run(lambda c: ec_store.list_ecs(c, after, limit, user, state, ecm))

    async def kill(self, ec_id: str, reason: str) -> EngineConn:
        """Order the agent to stop it; resources are released when its exit is reported."""
        now = self.core.clock.now()

        async def body(conn: Conn) -> EngineConn:
            ec = await ec_store.get_ec(conn, ec_id)
            if not ec.state.live:
                return ec
            if not ec.ecm_instance:
                if ec.ticket_id:
                    await ticket_store.release(conn, ec.ticket_id, now, reason)
                await ec_store.update_ec(
                    conn, ec_id, now, state=EcState.FAILED, ended_at=now, reason=reason
                )
                return replace(
                    ec, state=EcState.FAILED, ended_at=now, reason=reason, updated_at=now
                )
            await self.queue_kill(conn, ec.ecm_instance, ec_id, reason, now)
            await ec_store.mark_shutting_down(conn, ec_id, ec.state, reason, now)
            # What the row now holds, without reading it again.
            return replace(ec, state=EcState.SHUTTING_DOWN, reason=reason, updated_at=now)

        return await self.db.run(body)

    async def queue_kill(
        self, conn: Conn, agent_id: str, ec_id: str, reason: str, now: datetime
    ) -> None:
        await ec_store.queue_command(
            conn,
            AgentCommand(
                self.core.new_id("cmd"),
                agent_id,
                ec_id,
                CommandKind.KILL,
                reason=reason,
                grace_seconds=self.settings.kill_grace,
            ),
            now,
            unless_pending=True,
        )

    async def commands_for(self, agent_id: str) -> AsyncIterator[AgentCommand]:
        """Pending commands for an agent, then each new one as it is queued."""
        sent: set[str] = set()
        with self.core.notifier.subscribe([agent_key(agent_id)]) as queued:
            while True:
                queued.clear()
                pending = await self.db.run(
                    ec_store.pending_commands, agent_id, frozenset(sent), one_statement=True
                )
                for command in pending:
                    if command.command_id not in sent:
                        sent.add(command.command_id)
                        yield command
                sent &= {c.command_id for c in pending}
                await queued.wait()


# The refusal when not a single ECM is registered: what to start, on a cluster and in the
# README's dev mode run as root (whose local agent needs a user to run EngineConns as).
NO_AGENT_HINT = (
    "no agent is registered: start ecm-agent on a worker (docs/operations.md); "
    "in dev mode as root, set LABELRM_DEV_USERS=<user> (see README)"
)


# What a ranking is made from: every ECM's status and the node lists.
_Candidates = tuple[list[EcmStatus], NodeLists]


async def _read_candidates(conn: Conn) -> _Candidates:
    return await ecm_store.list_ecm_status(conn), await ecm_store.node_lists(conn)


def _no_ecm(ec_id: str, choices: list[EcmChoiceRecord]) -> LabelrmError:
    if not choices:
        message = f"no ECM can host EngineConn {ec_id}: {NO_AGENT_HINT}"
        return FailedPrecondition(message, state="NO_ECM", reason="NO_ELIGIBLE_ECM")
    detail = "; ".join(f"{c.instance}: {', '.join(c.reasons)}" for c in choices)
    message = f"no ECM can host EngineConn {ec_id} (ECMs: {detail})"
    if any("resource:" in r and "available" in r for c in choices for r in c.reasons):
        return ResourceExhausted(message, reason="NO_ECM_WITH_CAPACITY")
    return FailedPrecondition(message, state="NO_ECM", reason="NO_ELIGIBLE_ECM")


def start_failure_reason(exc: BaseException) -> str:
    """The reason a failed start records: the error's own message, "cancelled" when the
    caller went away; anything else is a bug in the RM and is recorded as one (the call
    still ends with it, so it surfaces as INTERNAL with its traceback in the log)."""
    err = as_rm_error(exc)  # a LabelrmError, or bad engine params (InvalidParam)
    if err is not None:
        return err.message
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return f"internal error: {type(exc).__name__}"


def with_grant(command: AgentCommand, ticket: Ticket) -> AgentCommand:
    """The launch command told what its ticket charges on the ECM: the memory limit and
    CPU quota its agent holds the EngineConn to."""
    if command.launch is None:
        return command
    memory, cpu = local_limits(ticket.locked)
    return replace(command, launch=replace(command.launch, memory_bytes=memory, cpu_millis=cpu))


def with_admitted_queue(command: AgentCommand, ticket: Ticket) -> AgentCommand:
    """The launch command told the queue its ticket was admitted in (the full path, as
    resolved at admission: rm_server/external), set last so no plugin input replaces it."""
    if command.launch is None or not ticket.requested.queue:
        return command
    environment = {**command.launch.environment, YARN_QUEUE_ENV: ticket.requested.queue}
    return replace(command, launch=replace(command.launch, environment=environment))
