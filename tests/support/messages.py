"""Request messages and values the tests build: labels, resources, registrations, applies, limits."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import (
    admin_pb2,
    resource_manager_pb2,
    resource_pb2,
)

from tests.support.env import T

GiB = 1024**3


def present(value: T | None) -> T:
    """`value`, which must not be None (narrows an Optional for the type checker)."""
    assert value is not None
    return value


def lbl(text: str) -> list[resource_pb2.Label]:
    out = []
    for part in text.split(","):
        key, _, value = part.partition("=")
        out.append(resource_pb2.Label(key=key, value=value))
    return out


def load(memory_bytes: int, cpu_millis: int) -> resource_pb2.Resource:
    return resource_pb2.Resource(
        load=resource_pb2.LoadResource(memory_bytes=memory_bytes, cpu_millis=cpu_millis)
    )


def load_instance(memory_bytes: int, cpu_millis: int, instances: int) -> resource_pb2.Resource:
    return resource_pb2.Resource(
        load_instance=resource_pb2.LoadInstanceResource(
            memory_bytes=memory_bytes, cpu_millis=cpu_millis, instances=instances
        )
    )


def register(
    instance: str,
    total: resource_pb2.Resource,
    protected: resource_pb2.Resource | None = None,
    request_id: str = "",
) -> resource_manager_pb2.RegisterEcmRequest:
    return resource_manager_pb2.RegisterEcmRequest(
        request_id=request_id,
        instance=instance,
        total_resource=total,
        protected_resource=protected,
    )


def apply_req(
    labels: str,
    resource: resource_pb2.Resource,
    request_id: str = "",
    wait: float = 0.0,
    user: str = "",
) -> resource_manager_pb2.ApplyRequest:
    wait_timeout = None
    if wait:
        wait_timeout = Duration(seconds=int(wait), nanos=int((wait % 1) * 1e9))
    return resource_manager_pb2.ApplyRequest(
        request_id=request_id,
        labels=lbl(labels),
        resource=resource,
        wait_timeout=wait_timeout,
        user=user,
    )


def limit_req(
    pattern: str, resource: resource_pb2.Resource, request_id: str = ""
) -> admin_pb2.SetLabelLimitRequest:
    return admin_pb2.SetLabelLimitRequest(
        request_id=request_id, labels=lbl(pattern), max_resource=resource
    )
