"""The one place that converts protobuf messages to domain objects and back.

Every conversion from the wire validates, and reports the offending field path
(for example `resource.load.memory_bytes` or `labels[2].value`) as InvalidArgument:
raised here, or a domain error that names the request field (told it by the
conversion, or by `field_of`), which the one mapping (rm_server.errors.as_rm_error)
answers with the same status.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from labelrm.v1 import admin_pb2, engine_conn_pb2, external_pb2, resource_manager_pb2, resource_pb2

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
    MeasuredUsage,
    ProcessReport,
    ProcessState,
)
from rm_server.domain.errors import DomainError
from rm_server.domain.external import ProviderConfig, QueueView, SchedulerSnapshot
from rm_server.domain.labels import Label, make_label, validate_labels
from rm_server.domain.limits import LabelPattern
from rm_server.domain.liveness import LivenessView
from rm_server.domain.model import (
    ConsistencyReport,
    Ecm,
    LabelResource,
    Mismatch,
    StoredLimit,
    Ticket,
)
from rm_server.domain.resources import (
    SPECIAL_PREFIX,
    InvalidResourceError,
    Resource,
    ResourceError,
    ResourceKind,
)
from rm_server.domain.resources import convert as convert_kind
from rm_server.errors import InvalidArgument

_TICKET_STATES = {
    "LOCKED": resource_manager_pb2.TICKET_STATE_LOCKED,
    "USED": resource_manager_pb2.TICKET_STATE_USED,
    "RELEASED": resource_manager_pb2.TICKET_STATE_RELEASED,
    "EXPIRED": resource_manager_pb2.TICKET_STATE_EXPIRED,
}
TICKET_STATE_NAMES = {v: k for k, v in _TICKET_STATES.items()}

MAX_WAIT_SECONDS = 3600.0


@contextmanager
def field_of(field: str, *, prefix: str = "", nested: bool = False) -> Iterator[None]:
    """A domain error raised inside concerns the request field `field`: it names it
    (followed by the error's own field, `nested`; its message after `prefix`). The one
    place a request field is attached to a domain error told none; the error then ends
    the call as INVALID_ARGUMENT (rm_server.errors.as_rm_error)."""
    try:
        yield
    except DomainError as exc:
        path = f"{field}.{exc.field}" if nested and exc.field else field
        raise exc.at(path, prefix + exc.message) from None


def resource_from_pb(msg: resource_pb2.Resource, field: str, *, required: bool = True) -> Resource:
    """Validate and convert a wire Resource; an unset `oneof` is refused when required."""
    which = msg.WhichOneof("kind")
    if which is None:
        if required:
            raise InvalidArgument(field, "must set exactly one resource type")
        raise ValueError("unset")
    try:
        return _resource_from_pb(msg, which)
    except ResourceError as exc:  # it names its dimension: the field is the wire's name of it
        dim = exc.dimension
        raise exc.at(f"{field}.{which}.{_wire_dimension(which, dim)}" if dim else field) from None


def resource_in_kind(r: Resource, kind: ResourceKind, field: str) -> Resource:
    """`r` widened to `kind` (a record holds one type), or an error naming `field`."""
    with field_of(field, prefix=f"must be of type {kind.value}: "):
        return convert_kind(r, kind)


def _wire_dimension(which: str, dimension: str) -> str:
    if which == "driver_and_yarn" and dimension in ("driver", "yarn"):  # a part unset
        return dimension
    if dimension.startswith(SPECIAL_PREFIX):
        return f"quantities[{dimension.removeprefix(SPECIAL_PREFIX)}]"
    if which == "yarn" or (which == "driver_and_yarn" and dimension.startswith("yarn.")):
        prefix = "yarn." if which == "driver_and_yarn" else ""
        return prefix + "queue_" + dimension.removeprefix("yarn.")
    return ("driver." if which == "driver_and_yarn" else "") + dimension


def _resource_from_pb(msg: resource_pb2.Resource, which: str) -> Resource:
    if which == "memory":
        return Resource.memory(msg.memory.memory_bytes)
    if which == "cpu":
        return Resource.cpu(msg.cpu.cpu_millis)
    if which == "load":
        return Resource.load(msg.load.memory_bytes, msg.load.cpu_millis)
    if which == "instance":
        return Resource.instance(msg.instance.instances)
    if which == "load_instance":
        li = msg.load_instance
        return Resource.load_instance(li.memory_bytes, li.cpu_millis, li.instances)
    if which == "yarn":
        return _yarn_from_pb(msg.yarn)
    if which == "driver_and_yarn":
        for part in ("driver", "yarn"):  # a driver in a YARN queue: neither half optional
            if not msg.driver_and_yarn.HasField(part):
                raise InvalidResourceError(f"the {part} part must be set", part)
        d = msg.driver_and_yarn.driver
        driver = Resource.load_instance(d.memory_bytes, d.cpu_millis, d.instances)
        return Resource.driver_and_yarn(driver, _yarn_from_pb(msg.driver_and_yarn.yarn))
    return Resource.special(dict(msg.special.quantities))


def _yarn_from_pb(y: resource_pb2.YarnResource) -> Resource:
    return Resource.yarn(y.queue_name, y.queue_memory_bytes, y.queue_cpu_millis, y.queue_instances)


def _yarn_to_pb(r: Resource) -> resource_pb2.YarnResource:
    return resource_pb2.YarnResource(
        queue_name=r.queue,
        queue_memory_bytes=r.get("yarn.memory_bytes"),
        queue_cpu_millis=r.get("yarn.cpu_millis"),
        queue_instances=r.get("yarn.instances"),
    )


def _load_instance_to_pb(r: Resource) -> resource_pb2.LoadInstanceResource:
    return resource_pb2.LoadInstanceResource(
        memory_bytes=r.get("memory_bytes"),
        cpu_millis=r.get("cpu_millis"),
        instances=r.get("instances"),
    )


def resource_to_pb(r: Resource) -> resource_pb2.Resource:
    out = resource_pb2.Resource()
    fill_resource(out, r)
    return out


def fill_resource(msg: resource_pb2.Resource, r: Resource) -> None:
    """Write `r` into an empty Resource message: in place, without building the parts as
    messages of their own and copying them in (which costs as much again)."""
    kind = r.kind
    if kind is ResourceKind.LOAD:  # the usual one first
        q = dict(r.quantities)
        load = msg.load
        load.memory_bytes = q["memory_bytes"]  # setting a field (even 0) sets the oneof
        load.cpu_millis = q["cpu_millis"]
    elif kind is ResourceKind.MEMORY:
        msg.memory.memory_bytes = r.get("memory_bytes")
    elif kind is ResourceKind.CPU:
        msg.cpu.cpu_millis = r.get("cpu_millis")
    elif kind is ResourceKind.INSTANCE:
        msg.instance.instances = r.get("instances")
    elif kind is ResourceKind.LOAD_INSTANCE:
        msg.load_instance.CopyFrom(_load_instance_to_pb(r))
    elif kind is ResourceKind.YARN:
        msg.yarn.CopyFrom(_yarn_to_pb(r))
    elif kind is ResourceKind.DRIVER_AND_YARN:
        msg.driver_and_yarn.driver.CopyFrom(_load_instance_to_pb(r))
        msg.driver_and_yarn.yarn.CopyFrom(_yarn_to_pb(r))
    else:
        msg.special.SetInParent()
        msg.special.quantities.update({k.removeprefix(SPECIAL_PREFIX): v for k, v in r.quantities})


# Labels already validated, by (key, value): the same few recur in every request, and a
# Label is immutable. Bounded: emptied when full.
_LABELS_SEEN: dict[tuple[str, str], Label] = {}
MAX_LABELS_SEEN = 4096


def labels_from_pb(
    msgs: Sequence[resource_pb2.Label], field: str = "labels", *, required: bool = True
) -> tuple[Label, ...]:
    """The request's labels, each checked as `field[i]` (a LabelError names the label's
    path, e.g. `labels[2].value`, or `labels` for too many)."""
    if required and not msgs:
        raise InvalidArgument(field, "at least one label is required")
    labels = tuple(_label(m.key, m.value, field, i) for i, m in enumerate(msgs))
    validate_labels(labels)
    return labels


def _label(key: str, value: str, field: str, index: int) -> Label:
    label = _LABELS_SEEN.get((key, value))
    if label is None:
        label = make_label(key, value, f"{field}[{index}]")
        if len(_LABELS_SEEN) >= MAX_LABELS_SEEN:
            _LABELS_SEEN.clear()
        _LABELS_SEEN[key, value] = label
    return label


def pattern_from_pb(msgs: Sequence[resource_pb2.Label], field: str = "labels") -> LabelPattern:
    if not msgs:
        raise InvalidArgument(field, "at least one label is required")
    text = ",".join(f"{m.key}={m.value}" for m in msgs)
    with field_of(field):
        return LabelPattern.parse(text)


def labels_to_pb(labels: Sequence[Label]) -> list[resource_pb2.Label]:
    return [resource_pb2.Label(key=lb.key, value=lb.value) for lb in labels]


def label_text_to_pb(text: str) -> list[resource_pb2.Label]:
    return [resource_pb2.Label(key=key, value=value) for key, value in label_pairs(text)]


def label_pairs(text: str) -> list[tuple[str, str]]:
    """A stored label text (``key=value,...``) as (key, value) pairs."""
    return [(key, value) for key, _, value in (p.partition("=") for p in text.split(","))]


# google.protobuf.Duration's own range (duration.proto): about +-10,000 years.
MAX_DURATION_SECONDS = 315_576_000_000
NANOS_PER_SECOND = 1_000_000_000


def check_duration(msg: Duration, field: str) -> None:
    """A Duration as duration.proto defines it: `nanos` within +-999,999,999 and of the
    sign of `seconds` (when both are non-zero), `seconds` within its range. Anything
    else is not a length of time, and is refused rather than read as some other one."""
    if not -NANOS_PER_SECOND < msg.nanos < NANOS_PER_SECOND:
        raise InvalidArgument(f"{field}.nanos", "must be between -999,999,999 and 999,999,999")
    if (msg.seconds < 0 < msg.nanos) or (msg.nanos < 0 < msg.seconds):
        raise InvalidArgument(f"{field}.nanos", "must have the sign of seconds")
    if not -MAX_DURATION_SECONDS <= msg.seconds <= MAX_DURATION_SECONDS:
        raise InvalidArgument(f"{field}.seconds", "is outside a Duration's range")


def duration_seconds(msg: Duration, field: str) -> float:
    """A valid, non-negative Duration of at most MAX_WAIT_SECONDS, in seconds."""
    check_duration(msg, field)
    seconds = msg.seconds + msg.nanos / 1e9
    if seconds < 0:
        raise InvalidArgument(field, "must not be negative")
    if seconds > MAX_WAIT_SECONDS:
        raise InvalidArgument(field, f"must be at most {MAX_WAIT_SECONDS:.0f}s")
    return seconds


# google.protobuf.Timestamp's range (timestamp.proto): 0001-01-01 to 9999-12-31, UTC.
MIN_TIMESTAMP_SECONDS = -62_135_596_800
MAX_TIMESTAMP_SECONDS = 253_402_300_799


def time_from_pb(msg: Timestamp, field: str) -> datetime:
    """A valid Timestamp (timestamp.proto's range, 0 <= nanos < 1e9) as a UTC datetime."""
    if not 0 <= msg.nanos < NANOS_PER_SECOND:
        raise InvalidArgument(f"{field}.nanos", "must be between 0 and 999,999,999")
    if not MIN_TIMESTAMP_SECONDS <= msg.seconds <= MAX_TIMESTAMP_SECONDS:
        raise InvalidArgument(f"{field}.seconds", "is outside a Timestamp's range")
    try:
        return msg.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError) as exc:  # the last microseconds of year 9999
        raise InvalidArgument(field, "is outside the range of a date") from exc


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)  # naive datetimes are UTC, as for Timestamp.FromDatetime


def fill_time(msg: Timestamp, dt: datetime) -> None:
    """`dt` into a Timestamp, exactly: protobuf's own FromDatetime is pure Python and
    several times slower than this subtraction."""
    delta = dt - (_NAIVE_EPOCH if dt.tzinfo is None else _EPOCH)
    msg.seconds = delta.days * 86400 + delta.seconds
    msg.nanos = delta.microseconds * 1000


def ts(dt: datetime | None) -> Timestamp | None:
    if dt is None:
        return None
    out = Timestamp()
    fill_time(out, dt)
    return out


def ticket_to_pb(t: Ticket) -> resource_manager_pb2.Ticket:
    out = resource_manager_pb2.Ticket()
    fill_ticket(out, t)
    return out


def fill_ticket(msg: resource_manager_pb2.Ticket, t: Ticket) -> None:
    """Write `t` into an empty Ticket message (in place: see `fill_resource`)."""
    msg.ticket_id = t.ticket_id
    msg.state = _TICKET_STATES[t.state.value]
    msg.user = t.user
    add_label = msg.labels.add
    for label in t.labels:
        add_label(key=label.key, value=label.value)
    msg.charged_labels.extend(t.charged_labels)
    fill_resource(msg.requested_resource, t.requested)
    if t.used is not None:
        fill_resource(msg.used_resource, t.used)
    fill_time(msg.create_time, t.created_at)
    fill_time(msg.update_time, t.updated_at)
    if t.lock_expires_at is not None:
        fill_time(msg.lock_expire_time, t.lock_expires_at)
    if t.ended_at is not None:
        fill_time(msg.end_time, t.ended_at)
    if t.end_reason:
        msg.end_reason = t.end_reason
    if t.measured is not None:
        msg.measured.CopyFrom(usage_to_pb(t.measured))


def fill_label_resource(msg: resource_manager_pb2.LabelResource, r: LabelResource) -> None:
    """Write `r` into an empty LabelResource message (in place: see `fill_resource`)."""
    msg.label = r.label
    add_label = msg.labels.add
    for key, value in label_pairs(r.label):
        add_label(key=key, value=value)
    msg.source = r.source
    if r.max_resource is not None:
        fill_resource(msg.max_resource, r.max_resource)
        left = r.left()
        if left is not None:
            fill_resource(msg.left_resource, left)
    fill_resource(msg.protected_resource, r.protected)
    fill_resource(msg.used_resource, r.used)
    fill_resource(msg.locked_resource, r.locked)
    msg.live_tickets = r.live_tickets
    fill_time(msg.update_time, r.updated_at)
    if r.reserved is not None:
        fill_resource(msg.reserved_resource, r.reserved)


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


def limit_to_pb(limit: StoredLimit) -> admin_pb2.LabelLimit:
    return admin_pb2.LabelLimit(
        pattern=limit.pattern,
        labels=label_text_to_pb(limit.pattern),
        max_resource=resource_to_pb(limit.max_resource),
        update_time=ts(limit.updated_at),
    )


def report_to_pb(report: ConsistencyReport) -> admin_pb2.CheckConsistencyResponse:
    return admin_pb2.CheckConsistencyResponse(
        consistent=not report.mismatches,
        mismatches=[_mismatch_to_pb(m) for m in report.mismatches],
        labels_checked=report.labels_checked,
        tickets_checked=report.tickets_checked,
        over_limit=[_mismatch_to_pb(m) for m in report.over_limit],
    )


def liveness_to_pb(view: LivenessView) -> admin_pb2.LivenessState:
    record = view.record
    return admin_pb2.LivenessState(
        heard_since=ts(record.heard_since),
        heard_since_reason=record.heard_since_reason,
        agents_judged_from=ts(view.agents_judged_from),
        engine_conns_judged_from=ts(view.engine_conns_judged_from),
        disrupted=record.disrupted_since is not None,
        disrupted_since=ts(record.disrupted_since),
        silent_agents=record.silent_agents,
        agents=record.agents,
        last_pass_time=ts(record.judged_at),
    )


def _mismatch_to_pb(m: Mismatch) -> admin_pb2.Mismatch:
    return admin_pb2.Mismatch(
        label=m.label,
        field=m.field,
        stored=resource_to_pb(m.stored) if m.stored is not None else None,
        expected=resource_to_pb(m.expected) if m.expected is not None else None,
        detail=m.detail,
    )


# ----- EngineConns, agents, ECM status ----------------------------------------------------

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


def usage_to_pb(u: MeasuredUsage) -> resource_pb2.ResourceUsage:
    return resource_pb2.ResourceUsage(**u.to_dict())  # the same four names


def usage_from_pb(msg: resource_pb2.ResourceUsage, field: str) -> MeasuredUsage:
    """A measurement an agent reports; INVALID_ARGUMENT naming the field if negative."""
    for name in ("memory_bytes", "memory_peak_bytes", "cpu_millis", "cpu_time_micros"):
        if getattr(msg, name) < 0:
            raise InvalidArgument(f"{field}.{name}", "must not be negative")
    return MeasuredUsage(
        msg.memory_bytes, msg.memory_peak_bytes, msg.cpu_millis, msg.cpu_time_micros
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


def provider_from_pb(msg: external_pb2.ExternalProvider, field: str = "provider") -> ProviderConfig:
    """A provider definition; INVALID_ARGUMENT naming the field when it is not valid."""
    with field_of(field, nested=True):
        return ProviderConfig(
            name=msg.name,
            type=msg.type or "yarn",  # type: ignore[arg-type]  # validated in __post_init__
            cluster=msg.cluster,
            addresses=tuple(a.rstrip("/") for a in msg.addresses),
            auth=msg.auth or "none",  # type: ignore[arg-type]  # validated in __post_init__
            username=msg.username,
            password=msg.password,
            timeout_seconds=msg.timeout_seconds or 5.0,
            cache_ttl_seconds=msg.cache_ttl_seconds if msg.HasField("cache_ttl_seconds") else 2.0,
            capacity_guaranteed=msg.capacity_guaranteed,
            password_secret=msg.password_secret,
        )


def provider_to_pb(p: ProviderConfig) -> external_pb2.ExternalProvider:
    """A provider for a response: never with its password."""
    return external_pb2.ExternalProvider(
        name=p.name,
        type=p.type.value,
        cluster=p.cluster,
        addresses=list(p.addresses),
        auth=p.auth.value,
        username=p.username,
        timeout_seconds=p.timeout_seconds,
        cache_ttl_seconds=p.cache_ttl_seconds,
        capacity_guaranteed=p.capacity_guaranteed,
        has_password=bool(p.password),
        password_secret=p.password_secret,
    )


def queue_view_to_pb(
    view: QueueView, snap: SchedulerSnapshot, error: str = ""
) -> external_pb2.ExternalQueue:
    """One queue's figures: YARN's max and used, labelrm's in flight, what is left."""
    f = view.figures
    return external_pb2.ExternalQueue(
        label=view.label,
        queue=f.path,
        scheduler=f.scheduler.value,
        leaf=f.leaf,
        yarn_max=resource_to_pb(f.maximum),
        yarn_used=resource_to_pb(f.used),
        in_flight=resource_to_pb(view.in_flight),
        left=resource_to_pb(view.left),
        apps_running=f.apps_running,
        apps_pending=f.apps_pending,
        fetch_time=ts(snap.fetched_at),
        error=error,
    )
