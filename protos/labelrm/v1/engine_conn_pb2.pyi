import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from labelrm.v1 import resource_pb2 as _resource_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EngineConnState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_CONN_STATE_UNSPECIFIED: _ClassVar[EngineConnState]
    ENGINE_CONN_STATE_STARTING: _ClassVar[EngineConnState]
    ENGINE_CONN_STATE_IDLE: _ClassVar[EngineConnState]
    ENGINE_CONN_STATE_BUSY: _ClassVar[EngineConnState]
    ENGINE_CONN_STATE_SHUTTING_DOWN: _ClassVar[EngineConnState]
    ENGINE_CONN_STATE_SUCCEEDED: _ClassVar[EngineConnState]
    ENGINE_CONN_STATE_FAILED: _ClassVar[EngineConnState]
    ENGINE_CONN_STATE_LOST: _ClassVar[EngineConnState]

class ProcessState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROCESS_STATE_UNSPECIFIED: _ClassVar[ProcessState]
    PROCESS_STATE_RUNNING: _ClassVar[ProcessState]
    PROCESS_STATE_EXITED: _ClassVar[ProcessState]
    PROCESS_STATE_LAUNCH_FAILED: _ClassVar[ProcessState]
ENGINE_CONN_STATE_UNSPECIFIED: EngineConnState
ENGINE_CONN_STATE_STARTING: EngineConnState
ENGINE_CONN_STATE_IDLE: EngineConnState
ENGINE_CONN_STATE_BUSY: EngineConnState
ENGINE_CONN_STATE_SHUTTING_DOWN: EngineConnState
ENGINE_CONN_STATE_SUCCEEDED: EngineConnState
ENGINE_CONN_STATE_FAILED: EngineConnState
ENGINE_CONN_STATE_LOST: EngineConnState
PROCESS_STATE_UNSPECIFIED: ProcessState
PROCESS_STATE_RUNNING: ProcessState
PROCESS_STATE_EXITED: ProcessState
PROCESS_STATE_LAUNCH_FAILED: ProcessState

class EcmChoice(_message.Message):
    __slots__ = ("instance", "eligible", "score", "reasons")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    instance: str
    eligible: bool
    score: float
    reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, instance: _Optional[str] = ..., eligible: _Optional[bool] = ..., score: _Optional[float] = ..., reasons: _Optional[_Iterable[str]] = ...) -> None: ...

class EngineConn(_message.Message):
    __slots__ = ("engine_conn_id", "state", "user", "labels", "params", "ecm_instance", "ticket_id", "resource", "address", "pid", "exit_code", "reason", "log_tail", "work_dir", "ecm_choices", "launch_attempts", "create_time", "update_time", "ready_time", "end_time", "holder", "hold_expire_time", "secret", "granted_resource", "measured", "measure_time")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENGINE_CONN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ECM_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    WORK_DIR_FIELD_NUMBER: _ClassVar[int]
    ECM_CHOICES_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    READY_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    HOLD_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    GRANTED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    MEASURE_TIME_FIELD_NUMBER: _ClassVar[int]
    engine_conn_id: str
    state: EngineConnState
    user: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    params: _containers.ScalarMap[str, str]
    ecm_instance: str
    ticket_id: str
    resource: _resource_pb2.Resource
    address: str
    pid: int
    exit_code: int
    reason: str
    log_tail: str
    work_dir: str
    ecm_choices: _containers.RepeatedCompositeFieldContainer[EcmChoice]
    launch_attempts: int
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    ready_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    holder: str
    hold_expire_time: _timestamp_pb2.Timestamp
    secret: str
    granted_resource: _resource_pb2.Resource
    measured: _resource_pb2.ResourceUsage
    measure_time: _timestamp_pb2.Timestamp
    def __init__(self, engine_conn_id: _Optional[str] = ..., state: _Optional[_Union[EngineConnState, str]] = ..., user: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., params: _Optional[_Mapping[str, str]] = ..., ecm_instance: _Optional[str] = ..., ticket_id: _Optional[str] = ..., resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., address: _Optional[str] = ..., pid: _Optional[int] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., log_tail: _Optional[str] = ..., work_dir: _Optional[str] = ..., ecm_choices: _Optional[_Iterable[_Union[EcmChoice, _Mapping]]] = ..., launch_attempts: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ready_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., holder: _Optional[str] = ..., hold_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., secret: _Optional[str] = ..., granted_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., measured: _Optional[_Union[_resource_pb2.ResourceUsage, _Mapping]] = ..., measure_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateEngineConnRequest(_message.Message):
    __slots__ = ("request_id", "user", "labels", "params", "timeout")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    user: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    params: _containers.ScalarMap[str, str]
    timeout: _duration_pb2.Duration
    def __init__(self, request_id: _Optional[str] = ..., user: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., params: _Optional[_Mapping[str, str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CreateEngineConnResponse(_message.Message):
    __slots__ = ("engine_conn",)
    ENGINE_CONN_FIELD_NUMBER: _ClassVar[int]
    engine_conn: EngineConn
    def __init__(self, engine_conn: _Optional[_Union[EngineConn, _Mapping]] = ...) -> None: ...

class AskEngineConnRequest(_message.Message):
    __slots__ = ("request_id", "user", "labels", "params", "timeout", "hold")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    user: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    params: _containers.ScalarMap[str, str]
    timeout: _duration_pb2.Duration
    hold: _duration_pb2.Duration
    def __init__(self, request_id: _Optional[str] = ..., user: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., params: _Optional[_Mapping[str, str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., hold: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AskEngineConnResponse(_message.Message):
    __slots__ = ("engine_conn", "reused")
    ENGINE_CONN_FIELD_NUMBER: _ClassVar[int]
    REUSED_FIELD_NUMBER: _ClassVar[int]
    engine_conn: EngineConn
    reused: bool
    def __init__(self, engine_conn: _Optional[_Union[EngineConn, _Mapping]] = ..., reused: _Optional[bool] = ...) -> None: ...

class GetEngineConnRequest(_message.Message):
    __slots__ = ("engine_conn_id",)
    ENGINE_CONN_ID_FIELD_NUMBER: _ClassVar[int]
    engine_conn_id: str
    def __init__(self, engine_conn_id: _Optional[str] = ...) -> None: ...

class GetEngineConnResponse(_message.Message):
    __slots__ = ("engine_conn",)
    ENGINE_CONN_FIELD_NUMBER: _ClassVar[int]
    engine_conn: EngineConn
    def __init__(self, engine_conn: _Optional[_Union[EngineConn, _Mapping]] = ...) -> None: ...

class ListEngineConnsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "user", "state", "ecm_instance")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ECM_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    user: str
    state: EngineConnState
    ecm_instance: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., user: _Optional[str] = ..., state: _Optional[_Union[EngineConnState, str]] = ..., ecm_instance: _Optional[str] = ...) -> None: ...

class ListEngineConnsResponse(_message.Message):
    __slots__ = ("engine_conns", "next_page_token")
    ENGINE_CONNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    engine_conns: _containers.RepeatedCompositeFieldContainer[EngineConn]
    next_page_token: str
    def __init__(self, engine_conns: _Optional[_Iterable[_Union[EngineConn, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class KillEngineConnRequest(_message.Message):
    __slots__ = ("request_id", "engine_conn_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_CONN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    engine_conn_id: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., engine_conn_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class KillEngineConnResponse(_message.Message):
    __slots__ = ("engine_conn",)
    ENGINE_CONN_FIELD_NUMBER: _ClassVar[int]
    engine_conn: EngineConn
    def __init__(self, engine_conn: _Optional[_Union[EngineConn, _Mapping]] = ...) -> None: ...

class StreamAgentCommandsRequest(_message.Message):
    __slots__ = ("agent_id",)
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    def __init__(self, agent_id: _Optional[str] = ...) -> None: ...

class StreamAgentCommandsResponse(_message.Message):
    __slots__ = ("command",)
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    command: AgentCommand
    def __init__(self, command: _Optional[_Union[AgentCommand, _Mapping]] = ...) -> None: ...

class AgentCommand(_message.Message):
    __slots__ = ("command_id", "launch", "kill", "cleanup")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    KILL_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    launch: LaunchCommand
    kill: KillCommand
    cleanup: CleanupCommand
    def __init__(self, command_id: _Optional[str] = ..., launch: _Optional[_Union[LaunchCommand, _Mapping]] = ..., kill: _Optional[_Union[KillCommand, _Mapping]] = ..., cleanup: _Optional[_Union[CleanupCommand, _Mapping]] = ...) -> None: ...

class LaunchCommand(_message.Message):
    __slots__ = ("engine_conn_id", "user", "engine_type", "launch_request", "granted_memory_bytes", "granted_cpu_millis")
    ENGINE_CONN_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_REQUEST_FIELD_NUMBER: _ClassVar[int]
    GRANTED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRANTED_CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    engine_conn_id: str
    user: str
    engine_type: str
    launch_request: EngineConnLaunchRequest
    granted_memory_bytes: int
    granted_cpu_millis: int
    def __init__(self, engine_conn_id: _Optional[str] = ..., user: _Optional[str] = ..., engine_type: _Optional[str] = ..., launch_request: _Optional[_Union[EngineConnLaunchRequest, _Mapping]] = ..., granted_memory_bytes: _Optional[int] = ..., granted_cpu_millis: _Optional[int] = ...) -> None: ...

class EngineConnLaunchRequest(_message.Message):
    __slots__ = ("program", "argv", "environment", "required_local_environment", "material_files")
    class EnvironmentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_LOCAL_ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    MATERIAL_FILES_FIELD_NUMBER: _ClassVar[int]
    program: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    environment: _containers.ScalarMap[str, str]
    required_local_environment: _containers.RepeatedScalarFieldContainer[str]
    material_files: _containers.RepeatedCompositeFieldContainer[MaterialFile]
    def __init__(self, program: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., environment: _Optional[_Mapping[str, str]] = ..., required_local_environment: _Optional[_Iterable[str]] = ..., material_files: _Optional[_Iterable[_Union[MaterialFile, _Mapping]]] = ...) -> None: ...

class MaterialFile(_message.Message):
    __slots__ = ("name", "content", "executable")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    EXECUTABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    content: bytes
    executable: bool
    def __init__(self, name: _Optional[str] = ..., content: _Optional[bytes] = ..., executable: _Optional[bool] = ...) -> None: ...

class KillCommand(_message.Message):
    __slots__ = ("engine_conn_id", "reason", "grace")
    ENGINE_CONN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_FIELD_NUMBER: _ClassVar[int]
    engine_conn_id: str
    reason: str
    grace: _duration_pb2.Duration
    def __init__(self, engine_conn_id: _Optional[str] = ..., reason: _Optional[str] = ..., grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CleanupCommand(_message.Message):
    __slots__ = ("engine_conn_id",)
    ENGINE_CONN_ID_FIELD_NUMBER: _ClassVar[int]
    engine_conn_id: str
    def __init__(self, engine_conn_id: _Optional[str] = ...) -> None: ...

class EngineConnProcess(_message.Message):
    __slots__ = ("engine_conn_id", "state", "pid", "exit_code", "reason", "log_tail", "work_dir", "usage", "out_of_memory")
    ENGINE_CONN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    WORK_DIR_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    OUT_OF_MEMORY_FIELD_NUMBER: _ClassVar[int]
    engine_conn_id: str
    state: ProcessState
    pid: int
    exit_code: int
    reason: str
    log_tail: str
    work_dir: str
    usage: _resource_pb2.ResourceUsage
    out_of_memory: bool
    def __init__(self, engine_conn_id: _Optional[str] = ..., state: _Optional[_Union[ProcessState, str]] = ..., pid: _Optional[int] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., log_tail: _Optional[str] = ..., work_dir: _Optional[str] = ..., usage: _Optional[_Union[_resource_pb2.ResourceUsage, _Mapping]] = ..., out_of_memory: _Optional[bool] = ...) -> None: ...

class ReportEngineConnStateRequest(_message.Message):
    __slots__ = ("engine_conn_id", "state", "address", "used_resource", "reason")
    ENGINE_CONN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    USED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    engine_conn_id: str
    state: EngineConnState
    address: str
    used_resource: _resource_pb2.Resource
    reason: str
    def __init__(self, engine_conn_id: _Optional[str] = ..., state: _Optional[_Union[EngineConnState, str]] = ..., address: _Optional[str] = ..., used_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportEngineConnStateResponse(_message.Message):
    __slots__ = ("shutdown", "heartbeat_interval")
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    shutdown: bool
    heartbeat_interval: _duration_pb2.Duration
    def __init__(self, shutdown: _Optional[bool] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
