import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from labelrm.v1 import resource_pb2 as _resource_pb2
from labelrm.v1 import resource_manager_pb2 as _resource_manager_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DemandState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEMAND_STATE_UNSPECIFIED: _ClassVar[DemandState]
    DEMAND_STATE_NEW: _ClassVar[DemandState]
    DEMAND_STATE_ACCEPTED: _ClassVar[DemandState]
    DEMAND_STATE_ALLOCATING: _ClassVar[DemandState]
    DEMAND_STATE_ALLOCATED: _ClassVar[DemandState]
    DEMAND_STATE_MONITORING: _ClassVar[DemandState]
    DEMAND_STATE_FINISHED: _ClassVar[DemandState]
    DEMAND_STATE_FAILED: _ClassVar[DemandState]

class DemandStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEMAND_STRATEGY_UNSPECIFIED: _ClassVar[DemandStrategy]
    DEMAND_STRATEGY_STRICT: _ClassVar[DemandStrategy]
    DEMAND_STRATEGY_LOOSE: _ClassVar[DemandStrategy]
DEMAND_STATE_UNSPECIFIED: DemandState
DEMAND_STATE_NEW: DemandState
DEMAND_STATE_ACCEPTED: DemandState
DEMAND_STATE_ALLOCATING: DemandState
DEMAND_STATE_ALLOCATED: DemandState
DEMAND_STATE_MONITORING: DemandState
DEMAND_STATE_FINISHED: DemandState
DEMAND_STATE_FAILED: DemandState
DEMAND_STRATEGY_UNSPECIFIED: DemandStrategy
DEMAND_STRATEGY_STRICT: DemandStrategy
DEMAND_STRATEGY_LOOSE: DemandStrategy

class TimePoint(_message.Message):
    __slots__ = ("now", "absolute", "relative", "rounds")
    NOW_FIELD_NUMBER: _ClassVar[int]
    ABSOLUTE_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    now: bool
    absolute: _timestamp_pb2.Timestamp
    relative: _duration_pb2.Duration
    rounds: int
    def __init__(self, now: _Optional[bool] = ..., absolute: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., relative: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., rounds: _Optional[int] = ...) -> None: ...

class TimeInterval(_message.Message):
    __slots__ = ("begin", "end")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    begin: TimePoint
    end: TimePoint
    def __init__(self, begin: _Optional[_Union[TimePoint, _Mapping]] = ..., end: _Optional[_Union[TimePoint, _Mapping]] = ...) -> None: ...

class TimeExpressionList(_message.Message):
    __slots__ = ("expressions",)
    EXPRESSIONS_FIELD_NUMBER: _ClassVar[int]
    expressions: _containers.RepeatedCompositeFieldContainer[TimeExpression]
    def __init__(self, expressions: _Optional[_Iterable[_Union[TimeExpression, _Mapping]]] = ...) -> None: ...

class TimeExpression(_message.Message):
    __slots__ = ("interval", "all_of", "any_of", "negation")
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ALL_OF_FIELD_NUMBER: _ClassVar[int]
    ANY_OF_FIELD_NUMBER: _ClassVar[int]
    NEGATION_FIELD_NUMBER: _ClassVar[int]
    interval: TimeInterval
    all_of: TimeExpressionList
    any_of: TimeExpressionList
    negation: TimeExpression
    def __init__(self, interval: _Optional[_Union[TimeInterval, _Mapping]] = ..., all_of: _Optional[_Union[TimeExpressionList, _Mapping]] = ..., any_of: _Optional[_Union[TimeExpressionList, _Mapping]] = ..., negation: _Optional[_Union[TimeExpression, _Mapping]] = ...) -> None: ...

class StartCondition(_message.Message):
    __slots__ = ("time", "strategy")
    TIME_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    time: TimeExpression
    strategy: DemandStrategy
    def __init__(self, time: _Optional[_Union[TimeExpression, _Mapping]] = ..., strategy: _Optional[_Union[DemandStrategy, str]] = ...) -> None: ...

class DurationCondition(_message.Message):
    __slots__ = ("duration", "strategy")
    DURATION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    duration: _duration_pb2.Duration
    strategy: DemandStrategy
    def __init__(self, duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., strategy: _Optional[_Union[DemandStrategy, str]] = ...) -> None: ...

class DeadlineCondition(_message.Message):
    __slots__ = ("time", "strategy")
    TIME_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    time: TimePoint
    strategy: DemandStrategy
    def __init__(self, time: _Optional[_Union[TimePoint, _Mapping]] = ..., strategy: _Optional[_Union[DemandStrategy, str]] = ...) -> None: ...

class OrderByList(_message.Message):
    __slots__ = ("expressions",)
    EXPRESSIONS_FIELD_NUMBER: _ClassVar[int]
    expressions: _containers.RepeatedCompositeFieldContainer[OrderByExpression]
    def __init__(self, expressions: _Optional[_Iterable[_Union[OrderByExpression, _Mapping]]] = ...) -> None: ...

class OrderByExpression(_message.Message):
    __slots__ = ("demand_id", "all_of", "any_of")
    DEMAND_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_OF_FIELD_NUMBER: _ClassVar[int]
    ANY_OF_FIELD_NUMBER: _ClassVar[int]
    demand_id: str
    all_of: OrderByList
    any_of: OrderByList
    def __init__(self, demand_id: _Optional[str] = ..., all_of: _Optional[_Union[OrderByList, _Mapping]] = ..., any_of: _Optional[_Union[OrderByList, _Mapping]] = ...) -> None: ...

class TimeConditions(_message.Message):
    __slots__ = ("start", "duration", "deadline", "order_by")
    START_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ORDER_BY_FIELD_NUMBER: _ClassVar[int]
    start: StartCondition
    duration: DurationCondition
    deadline: DeadlineCondition
    order_by: OrderByExpression
    def __init__(self, start: _Optional[_Union[StartCondition, _Mapping]] = ..., duration: _Optional[_Union[DurationCondition, _Mapping]] = ..., deadline: _Optional[_Union[DeadlineCondition, _Mapping]] = ..., order_by: _Optional[_Union[OrderByExpression, _Mapping]] = ...) -> None: ...

class DemandEvent(_message.Message):
    __slots__ = ("from_state", "to_state", "time", "reason")
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    from_state: DemandState
    to_state: DemandState
    time: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, from_state: _Optional[_Union[DemandState, str]] = ..., to_state: _Optional[_Union[DemandState, str]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class OrderByWait(_message.Message):
    __slots__ = ("demand_id", "state", "planned_end_time")
    DEMAND_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PLANNED_END_TIME_FIELD_NUMBER: _ClassVar[int]
    demand_id: str
    state: DemandState
    planned_end_time: _timestamp_pb2.Timestamp
    def __init__(self, demand_id: _Optional[str] = ..., state: _Optional[_Union[DemandState, str]] = ..., planned_end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Demand(_message.Message):
    __slots__ = ("demand_id", "state", "user", "labels", "charged_labels", "resource", "time_conditions", "time_conditions_text", "reason", "submit_time", "update_time", "planned_start_time", "plan_start_time", "plan_end_time", "slip", "passed_over_rounds", "ticket_id", "allocate_time", "claim_expire_time", "claim_time", "end_time", "overruns", "events", "waiting_for", "waiting", "order_by_missing_time")
    DEMAND_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CHARGED_LABELS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TIME_CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    TIME_CONDITIONS_TEXT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    PLANNED_START_TIME_FIELD_NUMBER: _ClassVar[int]
    PLAN_START_TIME_FIELD_NUMBER: _ClassVar[int]
    PLAN_END_TIME_FIELD_NUMBER: _ClassVar[int]
    SLIP_FIELD_NUMBER: _ClassVar[int]
    PASSED_OVER_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CLAIM_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    OVERRUNS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    ORDER_BY_MISSING_TIME_FIELD_NUMBER: _ClassVar[int]
    demand_id: str
    state: DemandState
    user: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    charged_labels: _containers.RepeatedScalarFieldContainer[str]
    resource: _resource_pb2.Resource
    time_conditions: TimeConditions
    time_conditions_text: str
    reason: str
    submit_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    planned_start_time: _timestamp_pb2.Timestamp
    plan_start_time: _timestamp_pb2.Timestamp
    plan_end_time: _timestamp_pb2.Timestamp
    slip: _duration_pb2.Duration
    passed_over_rounds: int
    ticket_id: str
    allocate_time: _timestamp_pb2.Timestamp
    claim_expire_time: _timestamp_pb2.Timestamp
    claim_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    overruns: _containers.RepeatedScalarFieldContainer[str]
    events: _containers.RepeatedCompositeFieldContainer[DemandEvent]
    waiting_for: _containers.RepeatedCompositeFieldContainer[OrderByWait]
    waiting: str
    order_by_missing_time: _timestamp_pb2.Timestamp
    def __init__(self, demand_id: _Optional[str] = ..., state: _Optional[_Union[DemandState, str]] = ..., user: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., charged_labels: _Optional[_Iterable[str]] = ..., resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., time_conditions: _Optional[_Union[TimeConditions, _Mapping]] = ..., time_conditions_text: _Optional[str] = ..., reason: _Optional[str] = ..., submit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., planned_start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., plan_start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., plan_end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., slip: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., passed_over_rounds: _Optional[int] = ..., ticket_id: _Optional[str] = ..., allocate_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., claim_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., claim_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., overruns: _Optional[_Iterable[str]] = ..., events: _Optional[_Iterable[_Union[DemandEvent, _Mapping]]] = ..., waiting_for: _Optional[_Iterable[_Union[OrderByWait, _Mapping]]] = ..., waiting: _Optional[str] = ..., order_by_missing_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitDemandRequest(_message.Message):
    __slots__ = ("demand_id", "user", "labels", "resource", "time_conditions_text", "time_conditions")
    DEMAND_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    TIME_CONDITIONS_TEXT_FIELD_NUMBER: _ClassVar[int]
    TIME_CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    demand_id: str
    user: str
    labels: _containers.RepeatedCompositeFieldContainer[_resource_pb2.Label]
    resource: _resource_pb2.Resource
    time_conditions_text: str
    time_conditions: TimeConditions
    def __init__(self, demand_id: _Optional[str] = ..., user: _Optional[str] = ..., labels: _Optional[_Iterable[_Union[_resource_pb2.Label, _Mapping]]] = ..., resource: _Optional[_Union[_resource_pb2.Resource, _Mapping]] = ..., time_conditions_text: _Optional[str] = ..., time_conditions: _Optional[_Union[TimeConditions, _Mapping]] = ...) -> None: ...

class SubmitDemandResponse(_message.Message):
    __slots__ = ("demand", "created")
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    demand: Demand
    created: bool
    def __init__(self, demand: _Optional[_Union[Demand, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetDemandRequest(_message.Message):
    __slots__ = ("demand_id", "user")
    DEMAND_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    demand_id: str
    user: str
    def __init__(self, demand_id: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class GetDemandResponse(_message.Message):
    __slots__ = ("demand",)
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    demand: Demand
    def __init__(self, demand: _Optional[_Union[Demand, _Mapping]] = ...) -> None: ...

class ListDemandsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "state", "user")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: DemandState
    user: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[DemandState, str]] = ..., user: _Optional[str] = ...) -> None: ...

class ListDemandsResponse(_message.Message):
    __slots__ = ("demands", "next_page_token")
    DEMANDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    demands: _containers.RepeatedCompositeFieldContainer[Demand]
    next_page_token: str
    def __init__(self, demands: _Optional[_Iterable[_Union[Demand, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelDemandRequest(_message.Message):
    __slots__ = ("request_id", "demand_id", "reason", "user")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEMAND_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    demand_id: str
    reason: str
    user: str
    def __init__(self, request_id: _Optional[str] = ..., demand_id: _Optional[str] = ..., reason: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class CancelDemandResponse(_message.Message):
    __slots__ = ("demand",)
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    demand: Demand
    def __init__(self, demand: _Optional[_Union[Demand, _Mapping]] = ...) -> None: ...

class ClaimDemandRequest(_message.Message):
    __slots__ = ("request_id", "demand_id", "user")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEMAND_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    demand_id: str
    user: str
    def __init__(self, request_id: _Optional[str] = ..., demand_id: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class ClaimDemandResponse(_message.Message):
    __slots__ = ("demand", "ticket")
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    demand: Demand
    ticket: _resource_manager_pb2.Ticket
    def __init__(self, demand: _Optional[_Union[Demand, _Mapping]] = ..., ticket: _Optional[_Union[_resource_manager_pb2.Ticket, _Mapping]] = ...) -> None: ...
