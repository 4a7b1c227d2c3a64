"""The answer to an agent's heartbeat, decided from what the RM knows of the agent (YARN's
NodeManager heartbeat, in Linkis' ECM terms): pure, without I/O.

The store reads every agent of a group of beats in one statement (`AgentSeen`,
rm_server/store/heartbeats.py); `answer_heartbeat` says what each beat is answered and
whether it is recorded; the use case (rm_server/app/agents.py) encodes the answer and
has the store write what it records, or finishes a beat that needs more by the full pass.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from rm_server.domain.engineconn import (
    AgentCommand,
    EcmState,
    HeartbeatAction,
    HeartbeatOutcome,
    MeasuredUsage,
    ProcessReport,
    ProcessState,
    any_vanished,
    needs_attention,
)


@dataclass
class AgentSeen:
    """One agent as the store found it for a group of beats."""

    state: EcmState
    heartbeat_seq: int
    last_response: bytes | None  # the stored answer to `heartbeat_seq` (for a resend)
    live_pids: dict[str, int] = field(default_factory=dict)  # live EngineConn -> pid
    acked: set[str] = field(default_factory=set)  # launches acknowledged before now
    pending: list[AgentCommand] = field(default_factory=list)


@dataclass(frozen=True)
class Beat:
    """One heartbeat: the agent, its sequence number, the processes it reports and the
    commands it carried out."""

    agent_id: str
    sequence: int
    processes: tuple[ProcessReport, ...]
    done_command_ids: tuple[str, ...]


class Reply(enum.Enum):
    """How a beat is answered."""

    OUTCOME = "outcome"  # BeatAnswer.outcome
    RESEND = "resend"  # the stored answer to the same sequence number, again
    FULL_PASS = "full_pass"  # more than an answer: the use case's full pass decides


@dataclass(frozen=True)
class BeatAnswer:
    """What a beat is answered and what is recorded of it: nothing (`record` False), or
    its sequence number, the commands it acknowledged and what it measured, with the
    answer itself when it is kept for a resend (`keep_outcome`). For the full pass, what
    it has to do: the reported processes that need attention (`attend`) and whether a
    live EngineConn vanished from the reports (`fence`); the rest are routine."""

    reply: Reply
    outcome: HeartbeatOutcome | None = None
    record: bool = False
    keep_outcome: bool = False
    measured: tuple[tuple[str, MeasuredUsage], ...] = ()
    attend: tuple[ProcessReport, ...] = ()
    fence: bool = False


def answer_heartbeat(beat: Beat, agent: AgentSeen | None, allowed: bool) -> BeatAnswer:
    """The answer to `beat` (`allowed`: the node lists let the agent in).

    An unknown agent -> REREGISTER; LOST -> REREGISTER (nothing recorded: it must register
    again); a resend of the last answered sequence -> that answer again; otherwise the
    beat is recorded (liveness, sequence, acknowledged commands) and answered SHUTDOWN if
    the node lists exclude the agent, CONTINUE with its pending commands if routine (no
    reported process `needs_attention`, none `any_vanished`, the agent RUNNING; that
    answer is kept for a resend), else by the full pass, which attends to the processes
    that need it, to those that vanished, and to a draining agent's end."""
    seq = beat.sequence
    if agent is None:
        return _outcome(HeartbeatAction.REREGISTER, "unknown agent", seq)
    resend = seq <= agent.heartbeat_seq and agent.last_response is not None
    if not allowed:
        shutdown = HeartbeatOutcome(
            HeartbeatAction.SHUTDOWN, reason="excluded by the node lists", sequence=seq
        )
        record = agent.state is not EcmState.LOST and not resend
        return BeatAnswer(Reply.OUTCOME, shutdown, record=record)
    if agent.state is EcmState.LOST:
        return _outcome(HeartbeatAction.REREGISTER, "agent was LOST", seq)
    if resend:
        return BeatAnswer(Reply.RESEND)
    measured = measured_of(beat.processes)
    attend = tuple(r for r in beat.processes if needs_attention(r, agent.live_pids))
    fence = any_vanished(beat.processes, agent.live_pids, agent.acked)
    if attend or fence or agent.state is not EcmState.RUNNING:
        return BeatAnswer(
            Reply.FULL_PASS, record=True, measured=measured, attend=attend, fence=fence
        )
    done = set(beat.done_command_ids)
    commands = tuple(c for c in agent.pending if c.command_id not in done)
    proceed = HeartbeatOutcome(HeartbeatAction.CONTINUE, commands, sequence=seq)
    return BeatAnswer(Reply.OUTCOME, proceed, record=True, keep_outcome=True, measured=measured)


def _outcome(action: HeartbeatAction, reason: str, seq: int) -> BeatAnswer:
    return BeatAnswer(Reply.OUTCOME, HeartbeatOutcome(action, reason=reason, sequence=seq))


def measured_of(reports: Sequence[ProcessReport]) -> tuple[tuple[str, MeasuredUsage], ...]:
    """The measurements a beat carries for running EngineConns (an ended one's last is
    stored as it ends)."""
    return tuple(
        (r.ec_id, r.usage)
        for r in reports
        if r.usage is not None and r.state is ProcessState.RUNNING
    )
