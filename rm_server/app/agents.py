"""The RM's side of agents and EngineConn processes: heartbeats (YARN's pull
model), EngineConn state reports, liveness, node lists and decommissioning.

Fencing: whatever an agent reports running that the RM no longer recognises (an
EngineConn it marked LOST, killed, or never launched there) is answered with a
kill command; an EngineConn whose own report the RM does not recognise is told
to shut down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rm_server.app.batching import Combiner, each_alone_on_failure
from rm_server.app.engineconns import EngineConnManager
from rm_server.app.liveness import LivenessJudge
from rm_server.domain.engineconn import (
    AgentCommand,
    CommandKind,
    EcmState,
    EcmStatus,
    EcmUsage,
    EcState,
    EngineConn,
    HeartbeatAction,
    HeartbeatOutcome,
    ProcessReport,
    ProcessState,
    ended_on_request,
    reported_transition,
)
from rm_server.domain.heartbeats import AgentSeen, Beat, Reply, answer_heartbeat
from rm_server.domain.liveness import LivenessRules, LivenessView
from rm_server.errors import FailedPrecondition, LabelrmError, NotFound
from rm_server.store import admin as admin_store
from rm_server.store import ecms as ecm_store
from rm_server.store import engineconns as ec_store
from rm_server.store import heartbeats as hb_store
from rm_server.store import tickets as ticket_store
from rm_server.store.db import Conn

log = logging.getLogger(__name__)


class AgentHub:
    """Heartbeats, reports and liveness; safe with several RM replicas (row locks)."""

    def __init__(self, ecs: EngineConnManager) -> None:
        self.ecs = ecs
        self.core = ecs.core
        self.db = ecs.db
        self.settings = ecs.settings
        self._beats: Combiner[_Beat] | None = None
        st = self.settings
        rules = LivenessRules(
            ecm_expiry=st.ecm_expiry,
            ec_expiry=st.ec_expiry,
            start_timeout=st.start_timeout,
            interval=self.core.settings.sweep_interval,
            disruption_share=st.disruption_share,
            disruption_min_agents=st.disruption_min_agents,
        )
        self.judge = LivenessJudge(
            self.db, self.core.clock, rules, lambda: self.core.replica_id, st.node_include_required
        )

    def _now(self) -> datetime:
        return self.core.clock.now()

    # ----- agent heartbeats ----------------------------------------------------------------

    async def heartbeat(
        self,
        agent_id: str,
        sequence: int,
        processes: Sequence[ProcessReport],
        done_command_ids: Sequence[str],
        encode: Callable[[HeartbeatOutcome], bytes],
    ) -> HeartbeatOutcome | bytes:
        """Handle one heartbeat; returns the outcome, or its encoded bytes (a resend gets
        the stored bytes of the first answer).

        Concurrent heartbeats share one transaction (rm_server/store/heartbeats.py): it
        records each beat and answers the routine ones, those asking for nothing but
        liveness and their commands. A beat that needs more (an EngineConn process to
        kill or to end, a pid to record, a vanished EngineConn, a draining ECM) is
        recorded there and finished here, on its own, by the full pass."""
        beat = _Beat(agent_id, sequence, tuple(processes), tuple(done_command_ids), encode)
        answer = await self._beat_combiner().submit(beat)
        if isinstance(answer, _FullPass):
            return await self._full_pass(beat, answer)
        assert isinstance(answer, (HeartbeatOutcome, bytes))
        return answer

    def _beat_combiner(self) -> Combiner[_Beat]:
        if self._beats is None:
            grouped = self.core.settings.batch_max > 0
            self._beats = Combiner(
                self._run_beats,
                max_batch=self.core.settings.batch_max if grouped else 1,
                max_inflight=self.core.settings.batch_inflight if grouped else 64,
                linger=self.core.settings.heartbeat_linger if grouped else 0.0,
            )
        return self._beats

    async def _run_beats(self, beats: Sequence[_Beat]) -> list[object]:
        """One transaction for a group of heartbeats of distinct agents (each alone should
        the group fail as a whole)."""
        return await each_alone_on_failure(self._beats_transaction, beats, "heartbeats")

    async def _beats_transaction(self, beats: Sequence[_Beat]) -> list[object]:
        now = self._now()

        async def body(conn: Conn) -> list[object]:
            seen = await hb_store.load(conn, [b.agent_id for b in beats], now)
            answers: list[object] = []
            writes: list[hb_store.BeatWrite] = []
            for beat in beats:
                allowed = seen.node_lists.allows(beat.agent_id, self.settings.node_include_required)
                answer, write = _answer(beat, seen.agents.get(beat.agent_id), allowed, now)
                answers.append(answer)
                if write is not None:
                    writes.append(write)
            await hb_store.record(conn, writes, now)
            return answers

        return await self.db.run(body, pipeline=True)

    async def _full_pass(self, beat: _Beat, work: _FullPass) -> HeartbeatOutcome:
        """The rest of a recorded heartbeat that needs more than an answer: the reported
        processes that need attention (the routine ones cost nothing), the EngineConns
        that vanished from the reports, a draining agent's end, then the answer with the
        commands pending after all that.

        An EngineConn that ends does so in a transaction of its own: its release locks its
        labels in their canonical order, and two ends in one transaction could hold two
        agents' user labels crosswise (a deadlock). The rest, which locks at most the rows
        of this agent's running EngineConns (in id order), shares one transaction."""
        agent_id = beat.agent_id
        running = sorted(
            (r for r in work.attend if r.state is ProcessState.RUNNING), key=lambda r: r.ec_id
        )
        for report in work.attend:
            if report.state is not ProcessState.RUNNING:
                await self.db.run(self._apply_process, agent_id, report)
        if work.fence:
            await self._fence_vanished(agent_id, {p.ec_id for p in beat.processes}, work.now)

        async def body(conn: Conn) -> HeartbeatOutcome:
            for report in running:
                await self._apply_process(conn, agent_id, report)
            if work.state is EcmState.DRAINING and await self._drained(conn, agent_id):
                return HeartbeatOutcome(
                    HeartbeatAction.SHUTDOWN, reason="decommissioned", sequence=beat.sequence
                )
            commands = await ec_store.pending_commands(conn, agent_id)
            outcome = HeartbeatOutcome(
                HeartbeatAction.CONTINUE, tuple(commands), sequence=beat.sequence
            )
            encoded = beat.encode(outcome)
            await ecm_store.store_response(conn, agent_id, beat.sequence, encoded)
            return outcome

        return await self.db.run(body)

    async def _apply_process(self, conn: Conn, agent_id: str, report: ProcessReport) -> None:
        now = self._now()
        ec = await ec_store.brief_ec(conn, report.ec_id)
        ours = ec is not None and ec.ecm_instance == agent_id
        if report.state is ProcessState.RUNNING:
            if ec is None or not ours or not ec.state.live:
                await self.ecs.queue_kill(conn, agent_id, report.ec_id, "not recognised", now)
            elif report.pid and report.pid != ec.pid:
                await ec_store.update_ec(
                    conn, report.ec_id, now, pid=report.pid, work_dir=report.work_dir or ec.work_dir
                )
            return
        # The process ended (or never started): end the EngineConn, then let the agent forget it.
        # (The measurements of running ones were stored with the beat: hb_store.record.)
        if ec is not None and ours and ec.state.live:
            await self._end_ec(
                conn,
                report.ec_id,
                ec.ticket_id,
                _ended_state(ec.state, report),
                _exit_reason(ec.state, report),
                now,
                report,
            )
        await ec_store.queue_command(
            conn,
            AgentCommand(self.core.new_id("cmd"), agent_id, report.ec_id, CommandKind.CLEANUP),
            now,
            unless_pending=True,
        )

    async def _end_ec(
        self,
        conn: Conn,
        ec_id: str,
        ticket_id: str,
        state: EcState,
        reason: str,
        now: datetime,
        report: ProcessReport | None = None,
        silent: tuple[datetime, datetime] | None = None,
        known: ec_store.EcBrief | None = None,
    ) -> None:
        """Release the ticket (labels, then ticket rows), then end the EngineConn row.
        `silent` (silent before, STARTING before): it ends for its silence, which is
        checked again under its row lock (_Heard, rolling the transaction back, if it
        reported since the judge read it). `known`: its row as this transaction read it
        already (no second read of whether a kill was ordered)."""
        kill = known.kill if known is not None else await ec_store.kill_of(conn, ec_id)
        if kill is not None and state is not EcState.LOST:  # stopped on request: one rule
            state, reason = ended_on_request(kill[0], state, kill[1], reason)
        if ticket_id:
            await ticket_store.release(conn, ticket_id, now, f"EngineConn {state.value.lower()}")
        current = await ec_store.brief_ec(conn, ec_id, lock=True)
        if current is None or not current.state.live:
            return
        if silent is not None and not await ec_store.is_silent(conn, ec_id, *silent):
            raise _Heard(ec_id)
        fields: dict[str, Any] = {"state": state, "ended_at": now, "reason": reason}
        measured = current.measured
        if report is not None:
            fields.update(exit_code=report.exit_code, log_tail=report.log_tail[-4000:])
            if report.usage is not None:
                measured = report.usage
                fields.update(measured=measured, measured_at=now)
        await ec_store.update_ec(conn, ec_id, now, **fields)
        if ticket_id and measured is not None:  # the ticket's audit row: what it used
            await ec_store.keep_measured(conn, ticket_id, ec_id, measured)
        log.info("EngineConn %s ended %s: %s", ec_id, state.value, reason)

    async def _fence_vanished(self, agent_id: str, reported: set[str], now: datetime) -> None:
        """Live EngineConns whose launch the agent acknowledged earlier but no longer
        reports have vanished (for example with the agent's state): LOST, released, each
        in a transaction of its own (see _full_pass)."""

        async def read(conn: Conn) -> tuple[set[str], list[EngineConn]]:
            acked = await ec_store.launch_done_before(conn, agent_id, now)
            return acked, await ec_store.live_ecs_on(conn, agent_id)

        acked, live = await self.db.run(read)
        for ec in live:
            if ec.ec_id in acked and ec.ec_id not in reported:
                await self.db.run(
                    self._end_ec,
                    ec.ec_id,
                    ec.ticket_id,
                    EcState.LOST,
                    "process no longer reported by its agent",
                    now,
                )

    async def _drained(self, conn: Conn, agent_id: str) -> bool:
        if await ec_store.live_ecs_on(conn, agent_id):
            return False
        await admin_store.unregister_ecm(conn, agent_id, self._now(), "decommissioned")
        log.info("ECM %s drained and left", agent_id)
        return True

    # ----- EngineConn reports --------------------------------------------------------------

    async def report_state(self, ec_id: str, state: EcState, address: str, reason: str) -> bool:
        """An EngineConn's heartbeat; True means it must shut down. What it uses is not
        its to say: its ticket charges what was granted (its agent measures the rest)."""
        now = self._now()

        async def body(conn: Conn) -> bool:
            ec = await ec_store.brief_ec(conn, ec_id)
            if ec is None or not ec.state.live:
                return True
            target = reported_transition(ec.state, state)
            if target is None:
                await ec_store.record_report(conn, ec_id, None, now)
                return False
            if ec.state is EcState.STARTING and target in (EcState.IDLE, EcState.BUSY):
                return await self._ready(conn, ec_id, ec.ticket_id, target, address, now)
            if target in (EcState.SUCCEEDED, EcState.FAILED):
                await self._end_ec(
                    conn,
                    ec_id,
                    ec.ticket_id,
                    target,
                    reason or f"EngineConn reported {target.value}",
                    now,
                    known=ec,
                )
                return False
            # Ordered by arrival: a report that arrived before one already recorded
            # changes nothing (ec_store.record_report).
            await ec_store.record_report(conn, ec_id, target, now)
            return False

        return await self.db.run(body)

    async def _ready(
        self,
        conn: Conn,
        ec_id: str,
        ticket_id: str,
        state: EcState,
        address: str,
        now: datetime,
    ) -> bool:
        try:
            # Everything locked becomes used: an EngineConn is held to its whole grant.
            await ticket_store.report_used(conn, ticket_id, None, now)
        except (FailedPrecondition, NotFound, LabelrmError) as exc:
            await self._end_ec(
                conn,
                ec_id,
                ticket_id,
                EcState.FAILED,
                f"its resource could not be reported: {exc.message}",
                now,
            )
            return True
        ready = await ec_store.update_ec(
            conn,
            ec_id,
            now,
            only_if={EcState.STARTING},
            state=state,
            address=address,
            ready_at=now,
            last_report_at=now,
        )
        if ready:
            return False
        current = await ec_store.brief_ec(conn, ec_id)  # it left STARTING meanwhile
        return current is None or not current.state.live

    # ----- liveness ----------------------------------------------------------------------

    async def sweep(self) -> None:
        """One pass of the liveness judge (app/liveness.py decides, this carries it out):
        ECMs silent past the expiry become LOST and their EngineConns are released;
        EngineConns silent past theirs (or never ready) are killed and released. Silence
        counts only while the RM could hear, and nothing is LOST during a suspected
        disruption (docs/architecture.md, "Liveness")."""
        verdict = await self.judge.verdict()
        now, silent_since = verdict.now, verdict.agents_silent_before
        for instance in verdict.lose:
            assert silent_since is not None
            lost = await self.db.run(ecm_store.mark_lost, instance, silent_since, now)
            if lost:
                log.warning("ECM %s is LOST: no heartbeat since %s", instance, silent_since)
                await self._lose_ecs_on(instance, now)
        if verdict.engine_conns is not None:
            await self._expire_ecs(now, *verdict.engine_conns)
        # Done commands older than an hour tell nothing any more (launch acks are
        # compared with the current heartbeat only).
        await self.db.run(lambda c: ec_store.purge_done_commands(c, now - timedelta(hours=1)))

    async def liveness(self) -> LivenessView:
        """The judge's state (GetClusterInfo, `rmctl status`, metrics)."""
        return await self.judge.view()

    async def _lose_ecs_on(self, instance: str, now: datetime) -> None:
        for ec in await self.db.run(lambda c: ec_store.live_ecs_on(c, instance)):
            await self.db.run(
                self._end_ec, ec.ec_id, ec.ticket_id, EcState.LOST, "its ECM was lost", now
            )

    async def _expire_ecs(self, now: datetime, silent: datetime, start_limit: datetime) -> None:
        expired = await self.db.run(lambda c: ec_store.silent_ecs(c, silent, start_limit))
        for ec in expired:  # one transaction each: label locks stay in canonical order
            try:
                await self.db.run(self._expire_one, ec.ec_id, (silent, start_limit), now)
            except _Heard:
                continue  # it reported meanwhile: the transaction rolled back

    async def _expire_one(
        self, conn: Conn, ec_id: str, silent: tuple[datetime, datetime], now: datetime
    ) -> None:
        ec = await ec_store.get_ec(conn, ec_id)
        if not ec.state.live:
            return
        if ec.state is EcState.STARTING:
            state, why = EcState.FAILED, "not ready within the start timeout"
        else:
            state, why = EcState.LOST, "no report within the expiry interval"
        if ec.ecm_instance:
            await self.ecs.queue_kill(conn, ec.ecm_instance, ec.ec_id, why, now)
        await self._end_ec(conn, ec.ec_id, ec.ticket_id, state, why, now, silent=silent)

    # ----- node lists and decommission -------------------------------------------------------

    async def refresh_nodes(self, include: Sequence[str], exclude: Sequence[str]) -> list[str]:
        lists = ecm_store.NodeLists(frozenset(include), frozenset(exclude))
        required = self.settings.node_include_required
        return await self.db.run(lambda c: ecm_store.replace_node_lists(c, lists, required))

    async def decommission(self, instance: str) -> int:
        now = self._now()

        async def body(conn: Conn) -> int:
            status = await ecm_store.ecm_status(conn, instance)
            if status.state is EcmState.LOST:
                raise FailedPrecondition(f"ECM {instance} is LOST", state="LOST")
            await ecm_store.set_state(conn, instance, EcmState.DRAINING, now)
            return status.live_engine_conns

        return await self.db.run(body)

    async def cordon(self, instance: str, cordoned: bool, reason: str = "") -> EcmStatus:
        """Cordon an ECM (no new work, what runs goes on) or uncordon it (which also calls
        off a decommission in progress); returns it as it is then."""
        now = self._now()

        async def body(conn: Conn) -> EcmStatus:
            if not await ecm_store.set_cordon(conn, instance, cordoned, reason, now):
                raise NotFound(f"ECM {instance} is not registered")
            return await ecm_store.ecm_status(conn, instance)

        status = await self.db.run(body)
        log.info("ECM %s %s%s", instance, "cordoned" if cordoned else "uncordoned",
                 f": {reason}" if reason else "")  # fmt: skip
        return status

    async def state_counts(self) -> dict[str, dict[str, int]]:
        return await self.db.run(ecm_store.state_counts)

    async def usage_by_ecm(self, limit: int) -> list[EcmUsage]:
        """Requested, granted and measured resource per ECM (for metrics)."""
        return await self.db.run(lambda c: ecm_store.usage_by_ecm(c, limit))

    async def ecm_status(self, instance: str) -> EcmStatus:
        return await self.db.run(lambda c: ecm_store.ecm_status(c, instance))

    async def list_ecm_status(self, after: str, limit: int) -> list[EcmStatus]:
        return await self.db.run(lambda c: ecm_store.list_ecm_status(c, after, limit))


def _ended_state(current: EcState, report: ProcessReport) -> EcState:
    if (
        report.state is ProcessState.EXITED
        and not report.out_of_memory
        and report.exit_code == 0
        and current in (EcState.SHUTTING_DOWN, EcState.IDLE, EcState.BUSY)
    ):
        return EcState.SUCCEEDED
    return EcState.FAILED


def _exit_reason(current: EcState, report: ProcessReport) -> str:
    if report.state is ProcessState.LAUNCH_FAILED:
        return f"launch refused by the agent: {report.reason}"
    if report.out_of_memory:  # the agent's words: "out of memory: limit 256Mi"
        return report.reason or "out of memory"
    if current is EcState.STARTING:
        return f"exited with code {report.exit_code} before it was ready"
    return f"exited with code {report.exit_code}"


@dataclass(eq=False)
class _Beat:
    """One agent heartbeat waiting for its group."""

    agent_id: str
    sequence: int
    processes: tuple[ProcessReport, ...]
    done_command_ids: tuple[str, ...]
    encode: Callable[[HeartbeatOutcome], bytes]

    @property
    def key(self) -> tuple[str, str, str]:
        return ("", "Heartbeat", self.agent_id)

    @property
    def view(self) -> Beat:
        """The beat as the domain answers it."""
        return Beat(self.agent_id, self.sequence, self.processes, self.done_command_ids)


class _Heard(Exception):
    """An EngineConn the judge found silent reported before it was ended."""


@dataclass(frozen=True)
class _FullPass:
    """The group recorded the beat; the caller finishes it with the full pass: the
    processes that need attention, whether any vanished (domain/heartbeats.py)."""

    state: EcmState
    now: datetime
    attend: tuple[ProcessReport, ...]
    fence: bool


def _answer(
    beat: _Beat, agent: AgentSeen | None, allowed: bool, now: datetime
) -> tuple[HeartbeatOutcome | bytes | _FullPass, hb_store.BeatWrite | None]:
    """What a beat is answered in its group, and what the group records for it: the
    domain's answer (rm_server/domain/heartbeats.py), encoded where it is kept for a
    resend."""
    decided = answer_heartbeat(beat.view, agent, allowed)
    answer: HeartbeatOutcome | bytes | _FullPass
    encoded = None
    if decided.reply is Reply.RESEND:
        assert agent is not None and agent.last_response is not None
        answer = agent.last_response
    elif decided.reply is Reply.FULL_PASS:
        assert agent is not None
        answer = _FullPass(agent.state, now, decided.attend, decided.fence)
    else:
        assert decided.outcome is not None
        answer = decided.outcome
        if decided.keep_outcome:
            answer = encoded = beat.encode(decided.outcome)
    if not decided.record:
        return answer, None
    write = hb_store.BeatWrite(
        beat.agent_id, beat.sequence, encoded, beat.done_command_ids, decided.measured
    )
    return answer, write
