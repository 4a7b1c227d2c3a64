from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemoryResource(_message.Message):
    __slots__ = ("memory_bytes",)
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    def __init__(self, memory_bytes: _Optional[int] = ...) -> None: ...

class CpuResource(_message.Message):
    __slots__ = ("cpu_millis",)
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    cpu_millis: int
    def __init__(self, cpu_millis: _Optional[int] = ...) -> None: ...

class LoadResource(_message.Message):
    __slots__ = ("memory_bytes", "cpu_millis")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    cpu_millis: int
    def __init__(self, memory_bytes: _Optional[int] = ..., cpu_millis: _Optional[int] = ...) -> None: ...

class InstanceResource(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: int
    def __init__(self, instances: _Optional[int] = ...) -> None: ...

class LoadInstanceResource(_message.Message):
    __slots__ = ("memory_bytes", "cpu_millis", "instances")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    cpu_millis: int
    instances: int
    def __init__(self, memory_bytes: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., instances: _Optional[int] = ...) -> None: ...

class YarnResource(_message.Message):
    __slots__ = ("queue_name", "queue_memory_bytes", "queue_cpu_millis", "queue_instances")
    QUEUE_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    queue_name: str
    queue_memory_bytes: int
    queue_cpu_millis: int
    queue_instances: int
    def __init__(self, queue_name: _Optional[str] = ..., queue_memory_bytes: _Optional[int] = ..., queue_cpu_millis: _Optional[int] = ..., queue_instances: _Optional[int] = ...) -> None: ...

class DriverAndYarnResource(_message.Message):
    __slots__ = ("driver", "yarn")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    YARN_FIELD_NUMBER: _ClassVar[int]
    driver: LoadInstanceResource
    yarn: YarnResource
    def __init__(self, driver: _Optional[_Union[LoadInstanceResource, _Mapping]] = ..., yarn: _Optional[_Union[YarnResource, _Mapping]] = ...) -> None: ...

class SpecialResource(_message.Message):
    __slots__ = ("quantities",)
    class QuantitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    QUANTITIES_FIELD_NUMBER: _ClassVar[int]
    quantities: _containers.ScalarMap[str, int]
    def __init__(self, quantities: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Resource(_message.Message):
    __slots__ = ("memory", "cpu", "load", "instance", "load_instance", "yarn", "driver_and_yarn", "special")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    LOAD_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    YARN_FIELD_NUMBER: _ClassVar[int]
    DRIVER_AND_YARN_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    memory: MemoryResource
    cpu: CpuResource
    load: LoadResource
    instance: InstanceResource
    load_instance: LoadInstanceResource
    yarn: YarnResource
    driver_and_yarn: DriverAndYarnResource
    special: SpecialResource
    def __init__(self, memory: _Optional[_Union[MemoryResource, _Mapping]] = ..., cpu: _Optional[_Union[CpuResource, _Mapping]] = ..., load: _Optional[_Union[LoadResource, _Mapping]] = ..., instance: _Optional[_Union[InstanceResource, _Mapping]] = ..., load_instance: _Optional[_Union[LoadInstanceResource, _Mapping]] = ..., yarn: _Optional[_Union[YarnResource, _Mapping]] = ..., driver_and_yarn: _Optional[_Union[DriverAndYarnResource, _Mapping]] = ..., special: _Optional[_Union[SpecialResource, _Mapping]] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Shortfall(_message.Message):
    __slots__ = ("label", "dimension", "requested", "available")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    label: str
    dimension: str
    requested: int
    available: int
    def __init__(self, label: _Optional[str] = ..., dimension: _Optional[str] = ..., requested: _Optional[int] = ..., available: _Optional[int] = ...) -> None: ...

class Shortfalls(_message.Message):
    __slots__ = ("shortfalls",)
    SHORTFALLS_FIELD_NUMBER: _ClassVar[int]
    shortfalls: _containers.RepeatedCompositeFieldContainer[Shortfall]
    def __init__(self, shortfalls: _Optional[_Iterable[_Union[Shortfall, _Mapping]]] = ...) -> None: ...

class ResourceUsage(_message.Message):
    __slots__ = ("memory_bytes", "memory_peak_bytes", "cpu_millis", "cpu_time_micros")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    CPU_TIME_MICROS_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    memory_peak_bytes: int
    cpu_millis: int
    cpu_time_micros: int
    def __init__(self, memory_bytes: _Optional[int] = ..., memory_peak_bytes: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., cpu_time_micros: _Optional[int] = ...) -> None: ...
