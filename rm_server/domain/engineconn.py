"""EngineConns, ECM records with liveness, and agent commands.

EngineConn lifecycle (after the Apache Linkis EngineConn node states; LOST when it or
its ECM falls silent):

    STARTING ──first IDLE report──> IDLE <──> BUSY
       │                              │        │
       │ launch failed / timeout      └──┬─────┘
       v                                 v
     FAILED <──exit != 0── SHUTTING_DOWN ──exit 0 / SUCCEEDED report──> SUCCEEDED
                      (max idle, kill)
    any live state ──silent past expiry, or ECM lost──> LOST

ECM lifecycle: RUNNING ──decommission──> DRAINING ──no EngineConns left──> (left)
               DRAINING ──uncordon──> RUNNING
               RUNNING / DRAINING ──silent past expiry──> LOST ──re-register──> RUNNING
A cordon (kubectl's) is beside the state: a cordoned ECM takes no new work in any state,
and stays cordoned through LOST spells until uncordoned. A node's history (its events)
outlives it: after it left, a LEFT event ends it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime

from rm_server.domain.labels import Label
from rm_server.domain.resources import Resource


class EcState(enum.StrEnum):
    STARTING = "STARTING"
    IDLE = "IDLE"
    BUSY = "BUSY"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    LOST = "LOST"

    @property
    def live(self) -> bool:
        return self not in ENDED_STATES


ENDED_STATES = frozenset({EcState.SUCCEEDED, EcState.FAILED, EcState.LOST})


def ended_on_request(
    killed_from: EcState, ended: EcState, kill_reason: str, detail: str
) -> tuple[EcState, str]:
    """How an EngineConn killed on request ends (its state, its reason), given the state it
    was in when the kill was ordered, how it ended (`ended`, as it or its agent reported)
    and what they said (`detail`).

    One rule for everything stopped on request (a cancelled demand follows it too): a stop
    that cuts work short is a failure, one that does not is not. An EngineConn killed
    before it was ready FAILED; one whose execution the stop cut short reports FAILED
    itself (only it knows whether one still ran); else it SUCCEEDED when it stopped
    cleanly. The reason is the kill's, with what went wrong after it when it FAILED, not
    the signal the process saw. (LOST is not an end on request: callers keep it.)"""
    if killed_from is EcState.STARTING:
        return EcState.FAILED, f"{kill_reason} (before it was ready)"
    if ended is EcState.FAILED:
        return ended, f"{kill_reason}: {detail}"
    return ended, kill_reason


LIVE_STATES = tuple(s for s in EcState if s not in ENDED_STATES)

# Transitions an EngineConn's own report may make; anything else is ignored.
REPORTED_TRANSITIONS: Mapping[EcState, frozenset[EcState]] = {
    EcState.STARTING: frozenset(
        {EcState.IDLE, EcState.BUSY, EcState.FAILED, EcState.SHUTTING_DOWN, EcState.SUCCEEDED}
    ),
    EcState.IDLE: frozenset(
        {EcState.BUSY, EcState.SHUTTING_DOWN, EcState.SUCCEEDED, EcState.FAILED}
    ),
    EcState.BUSY: frozenset(
        {EcState.IDLE, EcState.SHUTTING_DOWN, EcState.SUCCEEDED, EcState.FAILED}
    ),
    EcState.SHUTTING_DOWN: frozenset({EcState.SUCCEEDED, EcState.FAILED}),
}


def reported_transition(current: EcState, reported: EcState) -> EcState | None:
    """The state after an EngineConn reports `reported`, or None to keep `current`."""
    if reported == current:
        return None
    allowed = REPORTED_TRANSITIONS.get(current, frozenset())
    return reported if reported in allowed else None


class EcmState(enum.StrEnum):
    RUNNING = "RUNNING"
    DRAINING = "DRAINING"
    LOST = "LOST"


class ProcessState(enum.StrEnum):
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    LAUNCH_FAILED = "LAUNCH_FAILED"


@dataclass(frozen=True)
class MeasuredUsage:
    """What an agent measured an EngineConn using, from its cgroup: memory now and at
    its peak (bytes), CPU on average over the agent's last sampling interval
    (millicores) and in total (microseconds)."""

    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    cpu_millis: int = 0
    cpu_time_micros: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "memory_bytes": self.memory_bytes,
            "memory_peak_bytes": self.memory_peak_bytes,
            "cpu_millis": self.cpu_millis,
            "cpu_time_micros": self.cpu_time_micros,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> MeasuredUsage:
        def num(key: str) -> int:
            value = data.get(key, 0)
            return value if isinstance(value, int) else 0

        return cls(
            num("memory_bytes"), num("memory_peak_bytes"), num("cpu_millis"),
            num("cpu_time_micros"),
        )  # fmt: skip


ISOLATION_MODES = ("cgroup-v2", "cgroup-v1", "none")


@dataclass(frozen=True)
class Isolation:
    """How an agent contains its EngineConns: ``cgroup-v2``, ``cgroup-v1`` or ``none``
    (the operator's explicit choice), with the controllers and parent cgroups it uses."""

    mode: str
    controllers: tuple[str, ...] = ()
    cgroup_parents: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "controllers": list(self.controllers),
            "cgroup_parents": list(self.cgroup_parents),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Isolation:
        controllers, parents = data.get("controllers", []), data.get("cgroup_parents", [])
        return cls(
            str(data.get("mode", "")),
            tuple(str(c) for c in controllers) if isinstance(controllers, list) else (),
            tuple(str(p) for p in parents) if isinstance(parents, list) else (),
        )


@dataclass(frozen=True)
class ProcessReport:
    """An agent's report on one EngineConn process."""

    ec_id: str
    state: ProcessState
    pid: int = 0
    exit_code: int = 0
    reason: str = ""
    log_tail: str = ""
    work_dir: str = ""
    usage: MeasuredUsage | None = None  # measured from its cgroup, when it has news
    out_of_memory: bool = False  # stopped over its memory: it ended FAILED


@dataclass(frozen=True)
class EcmChoiceRecord:
    instance: str
    eligible: bool
    score: float
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class EngineConn:
    ec_id: str
    state: EcState
    user: str
    labels: tuple[Label, ...]
    params: Mapping[str, str]
    engine: str
    resource: Resource
    created_at: datetime
    updated_at: datetime
    ecm_instance: str = ""
    ticket_id: str = ""
    address: str = ""
    pid: int = 0
    exit_code: int = 0
    reason: str = ""
    log_tail: str = ""
    work_dir: str = ""
    ecm_choices: tuple[EcmChoiceRecord, ...] = ()
    launch_attempts: int = 0
    holder: str = ""
    hold_expires_at: datetime | None = None
    ready_at: datetime | None = None
    ended_at: datetime | None = None
    # What its ticket charges (set at launch): on its ECM, its cgroup's limits.
    granted: Resource | None = None
    measured: MeasuredUsage | None = None  # its agent's last measurement, if any
    measured_at: datetime | None = None
    # The bearer token its executor requires. Out of repr so that logging an EngineConn
    # never writes it out; only the owner's Create / Ask / Get responses carry it.
    secret: str = field(default="", repr=False)


@dataclass(frozen=True)
class LaunchPayload:
    """What a launch command carries (the engine plugin's launch request, as data)."""

    user: str
    engine_type: str
    program: str
    argv: tuple[str, ...]
    # Out of repr: the environment holds the executor secret, the files the EngineConn's key.
    environment: Mapping[str, str] = field(repr=False)
    required_local_environment: tuple[str, ...]
    material_files: tuple[tuple[str, bytes, bool], ...] = field(default=(), repr=False)
    # What the RM granted on the ECM (0: not granted): its cgroup's memory limit and CPU
    # quota on the agent.
    memory_bytes: int = 0
    cpu_millis: int = 0


class CommandKind(enum.StrEnum):
    """What an agent command asks (its value is the one stored in agent_command.kind)."""

    LAUNCH = "launch"
    KILL = "kill"
    CLEANUP = "cleanup"


class HeartbeatAction(enum.StrEnum):
    CONTINUE = "CONTINUE"
    REREGISTER = "REREGISTER"
    SHUTDOWN = "SHUTDOWN"


@dataclass(frozen=True)
class AgentCommand:
    command_id: str
    agent_id: str
    ec_id: str
    kind: CommandKind
    launch: LaunchPayload | None = None
    reason: str = ""
    grace_seconds: float = 0.0


@dataclass(frozen=True)
class EcmStatus:
    instance: str
    labels: tuple[Label, ...]
    state: EcmState
    total: Resource
    protected: Resource
    left: Resource | None
    registered_at: datetime
    updated_at: datetime
    last_heartbeat_at: datetime | None
    live_engine_conns: int
    isolation: Isolation | None = None  # None: its agent did not say (an older one)
    # No new work while cordoned (CordonEcm); what runs there goes on.
    cordoned: bool = False
    cordon_reason: str = ""


@dataclass(frozen=True)
class EcmUsage:
    """Over one ECM's live EngineConns: the sums of what they asked for, what their
    tickets charge (granted) and what their agent measured (for metrics)."""

    ecm: str
    engine_conns: int
    requested_memory_bytes: int
    requested_cpu_millis: int
    granted_memory_bytes: int
    granted_cpu_millis: int
    measured: MeasuredUsage


@dataclass(frozen=True)
class HeartbeatOutcome:
    action: HeartbeatAction
    commands: tuple[AgentCommand, ...] = ()
    reason: str = ""
    sequence: int = 0


def local_limits(granted: Resource) -> tuple[int, int]:
    """(memory bytes, CPU millicores) of a grant that its ECM's agent enforces: the
    resource's own memory and CPU (a driver_and_yarn's driver part; 0 where the kind has
    none). The YARN part runs elsewhere."""
    return granted.get("memory_bytes"), granted.get("cpu_millis")


def needs_attention(report: ProcessReport, live_pids: Mapping[str, int]) -> bool:
    """True when a reported process asks for more than liveness: it ended (or never
    started), the RM has no live EngineConn of that id on the agent (it is to be
    killed), or it brings a pid the RM has not recorded."""
    if report.state is not ProcessState.RUNNING or report.ec_id not in live_pids:
        return True
    return bool(report.pid) and report.pid != live_pids[report.ec_id]


def any_vanished(
    reports: Sequence[ProcessReport], live_pids: Mapping[str, int], acked: AbstractSet[str]
) -> bool:
    """True when a live EngineConn whose launch the agent acknowledged earlier is not
    among the processes it reports (it vanished: the full pass fences it)."""
    reported = {r.ec_id for r in reports}
    return any(ec_id in live_pids and ec_id not in reported for ec_id in acked)


def node_allowed(
    instance: str,
    include: frozenset[str],
    exclude: frozenset[str],
    include_required: bool = False,
) -> bool:
    """YARN-style include/exclude: entries name an instance (`host:port`) or a host.

    Excluded wins; an empty include list allows every ECM that is not excluded, unless
    `include_required` (the operator's setting ``node_include_required``): then only the
    ECMs the include list names are allowed, and none while it is empty.
    """
    host = instance.rsplit(":", 1)[0] if ":" in instance else instance
    if instance in exclude or host in exclude:
        return False
    if not include:
        return not include_required
    return instance in include or host in include


def label_set(labels: tuple[Label, ...]) -> str:
    """Order-independent text of a label set, for matching reusable EngineConns."""
    return ",".join(sorted(str(label) for label in labels))
