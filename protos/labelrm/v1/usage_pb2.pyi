import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UsageGrouping(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    USAGE_GROUPING_UNSPECIFIED: _ClassVar[UsageGrouping]
    USAGE_GROUPING_USER: _ClassVar[UsageGrouping]
    USAGE_GROUPING_LABEL: _ClassVar[UsageGrouping]
    USAGE_GROUPING_ENGINE_TYPE: _ClassVar[UsageGrouping]
    USAGE_GROUPING_USER_CREATOR: _ClassVar[UsageGrouping]
    USAGE_GROUPING_HOUR: _ClassVar[UsageGrouping]
USAGE_GROUPING_UNSPECIFIED: UsageGrouping
USAGE_GROUPING_USER: UsageGrouping
USAGE_GROUPING_LABEL: UsageGrouping
USAGE_GROUPING_ENGINE_TYPE: UsageGrouping
USAGE_GROUPING_USER_CREATOR: UsageGrouping
USAGE_GROUPING_HOUR: UsageGrouping

class GetUsageRequest(_message.Message):
    __slots__ = ("since", "until", "group_by", "user", "page_size", "page_token")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    group_by: UsageGrouping
    user: str
    page_size: int
    page_token: str
    def __init__(self, since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., group_by: _Optional[_Union[UsageGrouping, str]] = ..., user: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("key", "tickets", "granted", "measured_memory_byte_seconds", "measured_cpu_seconds", "measured_granted_memory_byte_seconds", "measured_granted_cpu_core_seconds", "memory_efficiency", "cpu_efficiency", "engine_conns", "engine_conns_failed", "engine_conn_seconds", "demands_planned", "demands_allocated", "demands_failed")
    class GrantedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    TICKETS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    MEASURED_MEMORY_BYTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_GRANTED_MEMORY_BYTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_GRANTED_CPU_CORE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    CPU_EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_CONNS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_CONNS_FAILED_FIELD_NUMBER: _ClassVar[int]
    ENGINE_CONN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEMANDS_PLANNED_FIELD_NUMBER: _ClassVar[int]
    DEMANDS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    DEMANDS_FAILED_FIELD_NUMBER: _ClassVar[int]
    key: str
    tickets: int
    granted: _containers.ScalarMap[str, float]
    measured_memory_byte_seconds: float
    measured_cpu_seconds: float
    measured_granted_memory_byte_seconds: float
    measured_granted_cpu_core_seconds: float
    memory_efficiency: float
    cpu_efficiency: float
    engine_conns: int
    engine_conns_failed: int
    engine_conn_seconds: float
    demands_planned: int
    demands_allocated: int
    demands_failed: int
    def __init__(self, key: _Optional[str] = ..., tickets: _Optional[int] = ..., granted: _Optional[_Mapping[str, float]] = ..., measured_memory_byte_seconds: _Optional[float] = ..., measured_cpu_seconds: _Optional[float] = ..., measured_granted_memory_byte_seconds: _Optional[float] = ..., measured_granted_cpu_core_seconds: _Optional[float] = ..., memory_efficiency: _Optional[float] = ..., cpu_efficiency: _Optional[float] = ..., engine_conns: _Optional[int] = ..., engine_conns_failed: _Optional[int] = ..., engine_conn_seconds: _Optional[float] = ..., demands_planned: _Optional[int] = ..., demands_allocated: _Optional[int] = ..., demands_failed: _Optional[int] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("rows", "next_page_token", "since", "until")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    next_page_token: str
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
