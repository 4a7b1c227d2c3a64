import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from labelrm.v1 import resource_pb2 as _resource_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExternalProvider(_message.Message):
    __slots__ = ("name", "type", "cluster", "addresses", "auth", "username", "password", "timeout_seconds", "cache_ttl_seconds", "capacity_guaranteed", "has_password", "password_secret")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_GUARANTEED_FIELD_NUMBER: _ClassVar[int]
    HAS_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_SECRET_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    cluster: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    auth: str
    username: str
    password: str
    timeout_seconds: float
    cache_ttl_seconds: float
    capacity_guaranteed: bool
    has_password: bool
    password_secret: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., cluster: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ..., auth: _Optional[str] = ..., username: _Optional[str] = ..., password: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., cache_ttl_seconds: _Optional[float] = ..., capacity_guaranteed: _Optional[bool] = ..., has_password: _Optional[bool] = ..., password_secret: _Optional[str] = ...) -> None: ...

class ExternalQueue(_message.Message):
    __slots__ = ("label", "queue", "scheduler", "leaf", "yarn_max", "yarn_used", "in_flight", "left", "apps_running", "apps_pending", "fetch_time", "error")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    YARN_MAX_FIELD_NUMBER: _ClassVar[int]
    YARN_USED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    APPS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    APPS_PENDING_FIELD_NUMBER: _ClassVar[int]
    FETCH_TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    label: str
    queue: str
    scheduler: str
    leaf: bool
    yarn_max: _resource_pb2.Resource
    yarn_used: _resource_pb2.Resource
    in_flight: _resource_pb2.Resource
    left: _resource_pb2.Resource
    apps_running: int
    apps_pending: int
    fetch_time: _timestamp_pb2.Timestamp
    error: str
    def __init__(self, label: _Optional[str] = ..., queue: _Optional[str] = ..., scheduler: _Optional[str] = ..., leaf: _Optional[bool] = ..., yarn_max: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., yarn_used: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., in_flight: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., left: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., apps_running: _Optional[int] = ..., apps_pending: _Optional[int] = ..., fetch_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...
