import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from labelrm.v1 import engine_conn_pb2 as _engine_conn_pb2
from labelrm.v1 import external_pb2 as _external_pb2
from labelrm.v1 import resource_pb2 as _resource_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EcmState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ECM_STATE_UNSPECIFIED: _ClassVar[EcmState]
    ECM_STATE_RUNNING: _ClassVar[EcmState]
    ECM_STATE_DRAINING: _ClassVar[EcmState]
    ECM_STATE_LOST: _ClassVar[EcmState]

class HeartbeatAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEARTBEAT_ACTION_UNSPECIFIED: _ClassVar[HeartbeatAction]
    HEARTBEAT_ACTION_CONTINUE: _ClassVar[HeartbeatAction]
    HEARTBEAT_ACTION_REREGISTER: _ClassVar[HeartbeatAction]
    HEARTBEAT_ACTION_SHUTDOWN: _ClassVar[HeartbeatAction]

class TicketState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TICKET_STATE_UNSPECIFIED: _ClassVar[TicketState]
    TICKET_STATE_LOCKED: _ClassVar[TicketState]
    TICKET_STATE_USED: _ClassVar[TicketState]
    TICKET_STATE_RELEASED: _ClassVar[TicketState]
    TICKET_STATE_EXPIRED: _ClassVar[TicketState]
ECM_STATE_UNSPECIFIED: EcmState
ECM_STATE_RUNNING: EcmState
ECM_STATE_DRAINING: EcmState
ECM_STATE_LOST: EcmState
HEARTBEAT_ACTION_UNSPECIFIED: HeartbeatAction
HEARTBEAT_ACTION_CONTINUE: HeartbeatAction
HEARTBEAT_ACTION_REREGISTER: HeartbeatAction
HEARTBEAT_ACTION_SHUTDOWN: HeartbeatAction
TICKET_STATE_UNSPECIFIED: TicketState
TICKET_STATE_LOCKED: TicketState
TICKET_STATE_USED: TicketState
TICKET_STATE_RELEASED: TicketState
TICKET_STATE_EXPIRED: TicketState

class HeartbeatRequest(_message.Message):
    __slots__ = ("agent_id", "sequence", "engine_conns", "done_command_ids")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_CONNS_FIELD_NUMBER: _ClassVar[int]
    DONE_COMMAND_IDS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    sequence: int
    engine_conns: _containers.RepeatedCompositeFieldContainer[_engine_conn_pb2.EngineConnProcess]
    done_command_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent_id: _Optional[str] = ..., sequence: _Optional[int] = ..., engine_conns: _Optional[_Iterable[_Union[_engine_conn_pb2.EngineConnProcess, _Mapping]]] = ..., done_command_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("action", "commands", "heartbeat_interval", "sequence", "reason")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    action: HeartbeatAction
    commands: _containers.RepeatedCompositeFieldContainer[_engine_conn_pb2.AgentCommand]
    heartbeat_interval: _duration_pb2.Duration
    sequence: int
    reason: str
    def __init__(self, action: _Optional[_Union[HeartbeatAction, str]] = ..., commands: _Optional[_Iterable[_Union[_engine_conn_pb2.AgentCommand, _Mapping]]] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., sequence: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class HeartbeatStreamRequest(_message.Message):
    __slots__ = ("heartbeat",)
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    heartbeat: HeartbeatRequest
    def __init__(self, heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ...) -> None: ...

class HeartbeatStreamResponse(_message.Message):
    __slots__ = ("heartbeat",)
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    heartbeat: HeartbeatResponse
    def __init__(self, heartbeat: _Optional[_Union[HeartbeatResponse, _Mapping]] = ...) -> None: ...

class GetEcmRequest(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: str
    def __init__(self, instance: _Optional[str] = ...) -> None: ...

class GetEcmResponse(_message.Message):
    __slots__ = ("ecm",)
    ECM_FIELD_NUMBER: _ClassVar[int]
    ecm: Ecm
    def __init__(self, ecm: _Optional[_Union[Ecm, _Mapping]] = ...) -> None: ...

class ListEcmsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEcmsResponse(_message.Message):
    __slots__ = ("ecms", "next_page_token")
    ECMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ecms: _containers.RepeatedCompositeFieldContainer[Ecm]
    next_page_token: str
    def __init__(self, ecms: _Optional[_Iterable[_Union[Ecm, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Ticket(_message.Message):
    __slots__ = ("ticket_id", "state", "labels", "charged_labels", "requested_resource", "used_resource", "create_time", "update_time", "lock_expire_time", "end_time", "end_reason", "user", "measured")
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CHARGED_LABELS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    USED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LOCK_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    ticket_id: str
    state: TicketState
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    charged_labels: _containers.RepeatedScalarFieldContainer[str]
    requested_resource: _resource_pb2.Resource
    used_resource: _resource_pb2.Resource
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    lock_expire_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    end_reason: str
    user: str
    measured: _resource_pb2.ResourceUsage
    def __init__(self, ticket_id: _Optional[str] = ..., state: _Optional[_Union[TicketState, str]] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., charged_labels: _Optional[_Iterable[str]] = ..., requested_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., used_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lock_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_reason: _Optional[str] = ..., user: _Optional[str] = ..., measured: _Optional[_Union[_resource_pb2.ResourceUsage, _Mapping]] = ...) -> None: ...

class LabelResource(_message.Message):
    __slots__ = ("label", "labels", "source", "max_resource", "protected_resource", "used_resource", "locked_resource", "left_resource", "live_tickets", "update_time", "reserved_resource", "external_queue")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MAX_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    USED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    LOCKED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    LEFT_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    LIVE_TICKETS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    RESERVED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_QUEUE_FIELD_NUMBER: _ClassVar[int]
    label: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    source: str
    max_resource: _resource_pb2.Resource
    protected_resource: _resource_pb2.Resource
    used_resource: _resource_pb2.Resource
    locked_resource: _resource_pb2.Resource
    left_resource: _resource_pb2.Resource
    live_tickets: int
    update_time: _timestamp_pb2.Timestamp
    reserved_resource: _resource_pb2.Resource
    external_queue: _external_pb2.ExternalQueue
    def __init__(self, label: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., source: _Optional[str] = ..., max_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., protected_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., used_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., locked_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., left_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., live_tickets: _Optional[int] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reserved_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., external_queue: _Optional[_Union[_external_pb2.ExternalQueue, _Mapping]] = ...) -> None: ...

class Ecm(_message.Message):
    __slots__ = ("instance", "labels", "total_resource", "protected_resource", "register_time", "update_time", "state", "last_heartbeat_time", "live_engine_conns", "left_resource", "isolation", "cordoned", "cordon_reason")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    REGISTER_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_TIME_FIELD_NUMBER: _ClassVar[int]
    LIVE_ENGINE_CONNS_FIELD_NUMBER: _ClassVar[int]
    LEFT_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    CORDON_REASON_FIELD_NUMBER: _ClassVar[int]
    instance: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    total_resource: _resource_pb2.Resource
    protected_resource: _resource_pb2.Resource
    register_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    state: EcmState
    last_heartbeat_time: _timestamp_pb2.Timestamp
    live_engine_conns: int
    left_resource: _resource_pb2.Resource
    isolation: Isolation
    cordoned: bool
    cordon_reason: str
    def __init__(self, instance: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., total_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., protected_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., register_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[EcmState, str]] = ..., last_heartbeat_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., live_engine_conns: _Optional[int] = ..., left_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., isolation: _Optional[_Union[Isolation, _Mapping]] = ..., cordoned: _Optional[bool] = ..., cordon_reason: _Optional[str] = ...) -> None: ...

class Isolation(_message.Message):
    __slots__ = ("mode", "controllers", "cgroup_parents")
    MODE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLERS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PARENTS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    controllers: _containers.RepeatedScalarFieldContainer[str]
    cgroup_parents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, mode: _Optional[str] = ..., controllers: _Optional[_Iterable[str]] = ..., cgroup_parents: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterEcmRequest(_message.Message):
    __slots__ = ("request_id", "instance", "labels", "total_resource", "protected_resource", "isolation")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    total_resource: _resource_pb2.Resource
    protected_resource: _resource_pb2.Resource
    isolation: Isolation
    def __init__(self, request_id: _Optional[str] = ..., instance: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., total_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., protected_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., isolation: _Optional[_Union[Isolation, _Mapping]] = ...) -> None: ...

class RegisterEcmResponse(_message.Message):
    __slots__ = ("ecm", "resource_changed")
    ECM_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_CHANGED_FIELD_NUMBER: _ClassVar[int]
    ecm: Ecm
    resource_changed: bool
    def __init__(self, ecm: _Optional[_Union[Ecm, _Mapping]] = ..., resource_changed: _Optional[bool] = ...) -> None: ...

class UnregisterEcmRequest(_message.Message):
    __slots__ = ("request_id", "instance")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance: str
    def __init__(self, request_id: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class UnregisterEcmResponse(_message.Message):
    __slots__ = ("released_ticket_ids",)
    RELEASED_TICKET_IDS_FIELD_NUMBER: _ClassVar[int]
    released_ticket_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, released_ticket_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("request_id", "labels", "resource", "wait_timeout", "user")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    resource: _resource_pb2.Resource
    wait_timeout: _duration_pb2.Duration
    user: str
    def __init__(self, request_id: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., wait_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., user: _Optional[str] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: Ticket
    def __init__(self, ticket: _Optional[_Union[Ticket, _Mapping]] = ...) -> None: ...

class ReportUsedRequest(_message.Message):
    __slots__ = ("request_id", "ticket_id", "used_resource")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    USED_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    ticket_id: str
    used_resource: _resource_pb2.Resource
    def __init__(self, request_id: _Optional[str] = ..., ticket_id: _Optional[str] = ..., used_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ...) -> None: ...

class ReportUsedResponse(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: Ticket
    def __init__(self, ticket: _Optional[_Union[Ticket, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_id", "ticket_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    ticket_id: str
    def __init__(self, request_id: _Optional[str] = ..., ticket_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: Ticket
    def __init__(self, ticket: _Optional[_Union[Ticket, _Mapping]] = ...) -> None: ...

class GetTicketRequest(_message.Message):
    __slots__ = ("ticket_id",)
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    ticket_id: str
    def __init__(self, ticket_id: _Optional[str] = ...) -> None: ...

class GetTicketResponse(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: Ticket
    def __init__(self, ticket: _Optional[_Union[Ticket, _Mapping]] = ...) -> None: ...

class ListTicketsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "label", "state", "user")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    label: str
    state: TicketState
    user: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., label: _Optional[str] = ..., state: _Optional[_Union[TicketState, str]] = ..., user: _Optional[str] = ...) -> None: ...

class ListTicketsResponse(_message.Message):
    __slots__ = ("tickets", "next_page_token")
    TICKETS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tickets: _containers.RepeatedCompositeFieldContainer[Ticket]
    next_page_token: str
    def __init__(self, tickets: _Optional[_Iterable[_Union[Ticket, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetLabelResourceRequest(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    def __init__(self, labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ...) -> None: ...

class GetLabelResourceResponse(_message.Message):
    __slots__ = ("label_resource",)
    LABEL_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    label_resource: LabelResource
    def __init__(self, label_resource: _Optional[_Union[LabelResource, _Mapping]] = ...) -> None: ...

class ListLabelResourcesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "source")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    source: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class ListLabelResourcesResponse(_message.Message):
    __slots__ = ("label_resources", "next_page_token")
    LABEL_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    label_resources: _containers.RepeatedCompositeFieldContainer[LabelResource]
    next_page_token: str
    def __init__(self, label_resources: _Optional[_Iterable[_Union[LabelResource, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
