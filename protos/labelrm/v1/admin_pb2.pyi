import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from labelrm.v1 import external_pb2 as _external_pb2
from labelrm.v1 import resource_pb2 as _resource_pb2
from labelrm.v1 import resource_manager_pb2 as _resource_manager_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutExternalProviderRequest(_message.Message):
    __slots__ = ("request_id", "provider")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    provider: _external_pb2.ExternalProvider
    def __init__(self, request_id: _Optional[str] = ..., provider: _Optional[_Union[_external_pb2.ExternalProvider, _Mapping]] = ...) -> None: ...

class PutExternalProviderResponse(_message.Message):
    __slots__ = ("provider",)
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    provider: _external_pb2.ExternalProvider
    def __init__(self, provider: _Optional[_Union[_external_pb2.ExternalProvider, _Mapping]] = ...) -> None: ...

class ListExternalProvidersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListExternalProvidersResponse(_message.Message):
    __slots__ = ("providers",)
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    providers: _containers.RepeatedCompositeFieldContainer[_external_pb2.ExternalProvider]
    def __init__(self, providers: _Optional[_Iterable[_Union[_external_pb2.ExternalProvider, _Mapping]]] = ...) -> None: ...

class DeleteExternalProviderRequest(_message.Message):
    __slots__ = ("request_id", "name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteExternalProviderResponse(_message.Message):
    __slots__ = ("provider",)
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    provider: _external_pb2.ExternalProvider
    def __init__(self, provider: _Optional[_Union[_external_pb2.ExternalProvider, _Mapping]] = ...) -> None: ...

class TestExternalProviderRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TestExternalProviderResponse(_message.Message):
    __slots__ = ("active_address", "scheduler", "queues")
    ACTIVE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    active_address: str
    scheduler: str
    queues: _containers.RepeatedCompositeFieldContainer[_external_pb2.ExternalQueue]
    def __init__(self, active_address: _Optional[str] = ..., scheduler: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[_external_pb2.ExternalQueue, _Mapping]]] = ...) -> None: ...

class RefreshNodesRequest(_message.Message):
    __slots__ = ("request_id", "include", "exclude")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    include: _containers.RepeatedScalarFieldContainer[str]
    exclude: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., include: _Optional[_Iterable[str]] = ..., exclude: _Optional[_Iterable[str]] = ...) -> None: ...

class RefreshNodesResponse(_message.Message):
    __slots__ = ("disallowed_instances",)
    DISALLOWED_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    disallowed_instances: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, disallowed_instances: _Optional[_Iterable[str]] = ...) -> None: ...

class DecommissionEcmRequest(_message.Message):
    __slots__ = ("request_id", "instance")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance: str
    def __init__(self, request_id: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class DecommissionEcmResponse(_message.Message):
    __slots__ = ("live_engine_conns",)
    LIVE_ENGINE_CONNS_FIELD_NUMBER: _ClassVar[int]
    live_engine_conns: int
    def __init__(self, live_engine_conns: _Optional[int] = ...) -> None: ...

class CordonEcmRequest(_message.Message):
    __slots__ = ("request_id", "instance", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., instance: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CordonEcmResponse(_message.Message):
    __slots__ = ("ecm",)
    ECM_FIELD_NUMBER: _ClassVar[int]
    ecm: _resource_manager_pb2.Ecm
    def __init__(self, ecm: _Optional[_Union[_resource_manager_pb2.Ecm, _Mapping]] = ...) -> None: ...

class UncordonEcmRequest(_message.Message):
    __slots__ = ("request_id", "instance")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance: str
    def __init__(self, request_id: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class UncordonEcmResponse(_message.Message):
    __slots__ = ("ecm",)
    ECM_FIELD_NUMBER: _ClassVar[int]
    ecm: _resource_manager_pb2.Ecm
    def __init__(self, ecm: _Optional[_Union[_resource_manager_pb2.Ecm, _Mapping]] = ...) -> None: ...

class LabelLimit(_message.Message):
    __slots__ = ("pattern", "labels", "max_resource", "update_time")
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    pattern: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    max_resource: _resource_pb2.Resource
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, pattern: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., max_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SetLabelLimitRequest(_message.Message):
    __slots__ = ("request_id", "labels", "max_resource")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    max_resource: _resource_pb2.Resource
    def __init__(self, request_id: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., max_resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ...) -> None: ...

class SetLabelLimitResponse(_message.Message):
    __slots__ = ("limit", "affected_labels")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFFECTED_LABELS_FIELD_NUMBER: _ClassVar[int]
    limit: LabelLimit
    affected_labels: int
    def __init__(self, limit: _Optional[_Union[LabelLimit, _Mapping]] = ..., affected_labels: _Optional[int] = ...) -> None: ...

class ListLabelLimitsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLabelLimitsResponse(_message.Message):
    __slots__ = ("limits", "next_page_token")
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[LabelLimit]
    next_page_token: str
    def __init__(self, limits: _Optional[_Iterable[_Union[LabelLimit, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteLabelLimitRequest(_message.Message):
    __slots__ = ("request_id", "labels")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    def __init__(self, request_id: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ...) -> None: ...

class DeleteLabelLimitResponse(_message.Message):
    __slots__ = ("affected_labels",)
    AFFECTED_LABELS_FIELD_NUMBER: _ClassVar[int]
    affected_labels: int
    def __init__(self, affected_labels: _Optional[int] = ...) -> None: ...

class CheckConsistencyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Mismatch(_message.Message):
    __slots__ = ("label", "field", "stored", "expected", "detail")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    label: str
    field: str
    stored: _resource_pb2.Resource
    expected: _resource_pb2.Resource
    detail: str
    def __init__(self, label: _Optional[str] = ..., field: _Optional[str] = ..., stored: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., expected: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., detail: _Optional[str] = ...) -> None: ...

class CheckConsistencyResponse(_message.Message):
    __slots__ = ("consistent", "mismatches", "labels_checked", "tickets_checked", "over_limit")
    CONSISTENT_FIELD_NUMBER: _ClassVar[int]
    MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    LABELS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    TICKETS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    OVER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    consistent: bool
    mismatches: _containers.RepeatedCompositeFieldContainer[Mismatch]
    labels_checked: int
    tickets_checked: int
    over_limit: _containers.RepeatedCompositeFieldContainer[Mismatch]
    def __init__(self, consistent: _Optional[bool] = ..., mismatches: _Optional[_Iterable[_Union[Mismatch, _Mapping]]] = ..., labels_checked: _Optional[int] = ..., tickets_checked: _Optional[int] = ..., over_limit: _Optional[_Iterable[_Union[Mismatch, _Mapping]]] = ...) -> None: ...

class GetClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RmReplica(_message.Message):
    __slots__ = ("replica_id", "host", "pid", "start_time")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    host: str
    pid: int
    start_time: _timestamp_pb2.Timestamp
    def __init__(self, replica_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetClusterInfoResponse(_message.Message):
    __slots__ = ("version", "replicas", "database", "waiting_applies", "time", "liveness")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    WAITING_APPLIES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    version: str
    replicas: _containers.RepeatedCompositeFieldContainer[RmReplica]
    database: str
    waiting_applies: int
    time: _timestamp_pb2.Timestamp
    liveness: LivenessState
    def __init__(self, version: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[RmReplica, _Mapping]]] = ..., database: _Optional[str] = ..., waiting_applies: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., liveness: _Optional[_Union[LivenessState, _Mapping]] = ...) -> None: ...

class LivenessState(_message.Message):
    __slots__ = ("heard_since", "heard_since_reason", "agents_judged_from", "engine_conns_judged_from", "disrupted", "disrupted_since", "silent_agents", "agents", "last_pass_time")
    HEARD_SINCE_FIELD_NUMBER: _ClassVar[int]
    HEARD_SINCE_REASON_FIELD_NUMBER: _ClassVar[int]
    AGENTS_JUDGED_FROM_FIELD_NUMBER: _ClassVar[int]
    ENGINE_CONNS_JUDGED_FROM_FIELD_NUMBER: _ClassVar[int]
    DISRUPTED_FIELD_NUMBER: _ClassVar[int]
    DISRUPTED_SINCE_FIELD_NUMBER: _ClassVar[int]
    SILENT_AGENTS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_PASS_TIME_FIELD_NUMBER: _ClassVar[int]
    heard_since: _timestamp_pb2.Timestamp
    heard_since_reason: str
    agents_judged_from: _timestamp_pb2.Timestamp
    engine_conns_judged_from: _timestamp_pb2.Timestamp
    disrupted: bool
    disrupted_since: _timestamp_pb2.Timestamp
    silent_agents: int
    agents: int
    last_pass_time: _timestamp_pb2.Timestamp
    def __init__(self, heard_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., heard_since_reason: _Optional[str] = ..., agents_judged_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., engine_conns_judged_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., disrupted: _Optional[bool] = ..., disrupted_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., silent_agents: _Optional[int] = ..., agents: _Optional[int] = ..., last_pass_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("kind", "id", "user")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    kind: str
    id: str
    user: str
    def __init__(self, kind: _Optional[str] = ..., id: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class StateEvent(_message.Message):
    __slots__ = ("time", "state", "reason")
    TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    state: str
    reason: str
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StateEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[StateEvent, _Mapping]]] = ...) -> None: ...
