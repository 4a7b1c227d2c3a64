"""Protobuf <-> domain for EngineConns, agents and ECMs: EngineConn records, agent
commands and heartbeats, process reports, isolation, an ECM and its status. The rest of the
conversions, and the rules every conversion follows (a field path in every error), are in
rm_server/service/convert.py; this module uses its helpers.
"""

from __future__ import annotations

from labelrm.v1 import engine_conn_pb2, resource_manager_pb2

from labelrm_common.durations import duration, seconds_to_parts
from rm_server.domain.engineconn import (
    ISOLATION_MODES,
    AgentCommand,
    CommandKind,
    EcmState,
    EcmStatus,
    EcState,
    EngineConn,
    HeartbeatAction,
    HeartbeatOutcome,
    Isolation,
    ProcessReport,
    ProcessState,
)
from rm_server.domain.model import Ecm
from rm_server.errors import InvalidArgument
from rm_server.service.convert import (
    labels_to_pb,
    resource_to_pb,
    ts,
    usage_from_pb,
    usage_to_pb,
)

_EC_STATES = {
    EcState.STARTING: engine_conn_pb2.ENGINE_CONN_STATE_STARTING,
    EcState.IDLE: engine_conn_pb2.ENGINE_CONN_STATE_IDLE,
    EcState.BUSY: engine_conn_pb2.ENGINE_CONN_STATE_BUSY,
    EcState.SHUTTING_DOWN: engine_conn_pb2.ENGINE_CONN_STATE_SHUTTING_DOWN,
    EcState.SUCCEEDED: engine_conn_pb2.ENGINE_CONN_STATE_SUCCEEDED,
    EcState.FAILED: engine_conn_pb2.ENGINE_CONN_STATE_FAILED,
    EcState.LOST: engine_conn_pb2.ENGINE_CONN_STATE_LOST,
}
EC_STATE_OF_PB = {v: k for k, v in _EC_STATES.items()}
_ECM_STATES = {
    EcmState.RUNNING: resource_manager_pb2.ECM_STATE_RUNNING,
    EcmState.DRAINING: resource_manager_pb2.ECM_STATE_DRAINING,
    EcmState.LOST: resource_manager_pb2.ECM_STATE_LOST,
}
_PROCESS_STATES = {
    engine_conn_pb2.PROCESS_STATE_RUNNING: ProcessState.RUNNING,
    engine_conn_pb2.PROCESS_STATE_EXITED: ProcessState.EXITED,
    engine_conn_pb2.PROCESS_STATE_LAUNCH_FAILED: ProcessState.LAUNCH_FAILED,
}
_ACTIONS = {
    HeartbeatAction.CONTINUE: resource_manager_pb2.HEARTBEAT_ACTION_CONTINUE,
    HeartbeatAction.REREGISTER: resource_manager_pb2.HEARTBEAT_ACTION_REREGISTER,
    HeartbeatAction.SHUTDOWN: resource_manager_pb2.HEARTBEAT_ACTION_SHUTDOWN,
}


def engine_conn_to_pb(ec: EngineConn, *, with_secret: bool = False) -> engine_conn_pb2.EngineConn:
    """`with_secret` only for the Create / Ask / Get responses: the policy gives those only
    to the owner, proxy users and admins, while lists and Kill carry no executor secret."""
    return engine_conn_pb2.EngineConn(
        engine_conn_id=ec.ec_id,
        state=_EC_STATES[ec.state],
        user=ec.user,
        labels=labels_to_pb(ec.labels),
        params=dict(ec.params),
        ecm_instance=ec.ecm_instance,
        ticket_id=ec.ticket_id,
        resource=resource_to_pb(ec.resource),
        address=ec.address,
        pid=ec.pid,
        exit_code=ec.exit_code,
        reason=ec.reason,
        log_tail=ec.log_tail,
        work_dir=ec.work_dir,
        ecm_choices=[
            engine_conn_pb2.EcmChoice(
                instance=c.instance, eligible=c.eligible, score=c.score, reasons=c.reasons
            )
            for c in ec.ecm_choices
        ],
        launch_attempts=ec.launch_attempts,
        create_time=ts(ec.created_at),
        update_time=ts(ec.updated_at),
        ready_time=ts(ec.ready_at),
        end_time=ts(ec.ended_at),
        holder=ec.holder,
        hold_expire_time=ts(ec.hold_expires_at),
        secret=ec.secret if with_secret else "",
        granted_resource=resource_to_pb(ec.granted) if ec.granted is not None else None,
        measured=usage_to_pb(ec.measured) if ec.measured is not None else None,
        measure_time=ts(ec.measured_at),
    )


def isolation_from_pb(msg: resource_manager_pb2.Isolation, field: str) -> Isolation:
    """How an agent says it contains EngineConns (bounded: it is stored and shown)."""
    if msg.mode not in ISOLATION_MODES:
        raise InvalidArgument(f"{field}.mode", f"must be one of {', '.join(ISOLATION_MODES)}")
    if len(msg.controllers) > 16 or any(len(c) > 32 for c in msg.controllers):
        raise InvalidArgument(f"{field}.controllers", "at most 16 names of 32 characters")
    if len(msg.cgroup_parents) > 16 or any(len(p) > 1024 for p in msg.cgroup_parents):
        raise InvalidArgument(f"{field}.cgroup_parents", "at most 16 paths of 1024 characters")
    return Isolation(msg.mode, tuple(msg.controllers), tuple(msg.cgroup_parents))


def isolation_to_pb(i: Isolation) -> resource_manager_pb2.Isolation:
    return resource_manager_pb2.Isolation(
        mode=i.mode, controllers=i.controllers, cgroup_parents=i.cgroup_parents
    )


def command_to_pb(cmd: AgentCommand) -> engine_conn_pb2.AgentCommand:
    out = engine_conn_pb2.AgentCommand(command_id=cmd.command_id)
    if cmd.kind is CommandKind.LAUNCH and cmd.launch is not None:
        lp = cmd.launch
        out.launch.CopyFrom(
            engine_conn_pb2.LaunchCommand(
                engine_conn_id=cmd.ec_id,
                user=lp.user,
                engine_type=lp.engine_type,
                launch_request=engine_conn_pb2.EngineConnLaunchRequest(
                    program=lp.program,
                    argv=list(lp.argv),
                    environment=dict(lp.environment),
                    required_local_environment=list(lp.required_local_environment),
                    material_files=[
                        engine_conn_pb2.MaterialFile(name=n, content=c, executable=x)
                        for n, c, x in lp.material_files
                    ],
                ),
                granted_memory_bytes=lp.memory_bytes,
                granted_cpu_millis=lp.cpu_millis,
            )
        )
    elif cmd.kind is CommandKind.KILL:
        out.kill.CopyFrom(
            engine_conn_pb2.KillCommand(
                engine_conn_id=cmd.ec_id, reason=cmd.reason, grace=duration(cmd.grace_seconds)
            )
        )
    else:
        out.cleanup.CopyFrom(engine_conn_pb2.CleanupCommand(engine_conn_id=cmd.ec_id))
    return out


def process_from_pb(msg: engine_conn_pb2.EngineConnProcess, field: str) -> ProcessReport:
    state = _PROCESS_STATES.get(msg.state)
    if state is None:
        raise InvalidArgument(f"{field}.state", "must be RUNNING, EXITED or LAUNCH_FAILED")
    if not msg.engine_conn_id or len(msg.engine_conn_id) > 128:
        raise InvalidArgument(f"{field}.engine_conn_id", "must be 1 to 128 characters")
    return ProcessReport(
        ec_id=msg.engine_conn_id,
        state=state,
        pid=msg.pid,
        exit_code=msg.exit_code,
        reason=msg.reason[:2000],
        log_tail=msg.log_tail[-4000:],
        work_dir=msg.work_dir[:4096],
        usage=usage_from_pb(msg.usage, f"{field}.usage") if msg.HasField("usage") else None,
        out_of_memory=msg.out_of_memory,
    )


def fill_heartbeat(
    msg: resource_manager_pb2.HeartbeatResponse, outcome: HeartbeatOutcome, interval: float
) -> None:
    """Write `outcome` into an empty HeartbeatResponse (in place: see `fill_resource`; a
    beat's own cost, paid thousands of times a second by a large fleet)."""
    msg.action = _ACTIONS[outcome.action]
    if outcome.commands:
        msg.commands.extend([command_to_pb(c) for c in outcome.commands])
    every = msg.heartbeat_interval
    every.seconds, every.nanos = seconds_to_parts(interval)
    msg.sequence = outcome.sequence
    if outcome.reason:
        msg.reason = outcome.reason


def ecm_status_to_pb(s: EcmStatus) -> resource_manager_pb2.Ecm:
    return resource_manager_pb2.Ecm(
        instance=s.instance,
        labels=labels_to_pb(s.labels),
        total_resource=resource_to_pb(s.total),
        protected_resource=resource_to_pb(s.protected),
        register_time=ts(s.registered_at),
        update_time=ts(s.updated_at),
        state=_ECM_STATES[s.state],
        last_heartbeat_time=ts(s.last_heartbeat_at),
        live_engine_conns=s.live_engine_conns,
        left_resource=resource_to_pb(s.left) if s.left is not None else None,
        isolation=isolation_to_pb(s.isolation) if s.isolation is not None else None,
        cordoned=s.cordoned,
        cordon_reason=s.cordon_reason,
    )


def ecm_to_pb(e: Ecm) -> resource_manager_pb2.Ecm:
    return resource_manager_pb2.Ecm(
        instance=e.instance,
        labels=labels_to_pb(e.labels),
        total_resource=resource_to_pb(e.total),
        protected_resource=resource_to_pb(e.protected),
        register_time=ts(e.registered_at),
        update_time=ts(e.updated_at),
        isolation=isolation_to_pb(e.isolation) if e.isolation is not None else None,
    )
