"""Python client SDK for labelrm.

    from labelrm_client import RMClient, labels_from, load

    with RMClient("127.0.0.1:7100") as rm:
        ticket = rm.apply("userCreator=alice-IDE,engineType=spark-3.2.1", load(4 << 30, 2000))
        rm.report_used(ticket.ticket_id)
        rm.release(ticket.ticket_id)

EngineConns (the ECM agents launch them as the requesting user):

    with RMClient() as rm:
        ec = rm.create_engine_conn("userCreator=alice-IDE,engineType=shell-1", user="alice")
        for item in rm.execute(ec, "id -un"):  # the EngineConn: its address and secret
            print(item)  # ExecOutput("stdout", "alice\n"), then ExecResult(0, False, "")
        rm.kill_engine_conn(ec.engine_conn_id)

Failures raise `RMError` subclasses (`ResourceExhausted.shortfalls`, `InvalidArgument.field`,
`FailedPrecondition.state`, ...), never a raw grpc.RpcError.
"""

from __future__ import annotations

from collections.abc import Mapping

from labelrm.v1 import resource_pb2

from labelrm_client._engineconn import AskResult, ExecItem, ExecOutput, ExecResult, ec_state
from labelrm_client._errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RMError,
    Shortfall,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from labelrm_client._impl import AsyncRMClient, LabelsLike, RMClient, parse_labels, to_labels

__all__ = [
    "AskResult",
    "AsyncRMClient",
    "DeadlineExceeded",
    "ExecItem",
    "ExecOutput",
    "ExecResult",
    "FailedPrecondition",
    "InvalidArgument",
    "LabelsLike",
    "NotFound",
    "PermissionDenied",
    "RMClient",
    "RMError",
    "ResourceExhausted",
    "Shortfall",
    "Unauthenticated",
    "Unavailable",
    "cpu",
    "ec_state",
    "from_rpc_error",
    "instance",
    "label",
    "labels",
    "labels_from",
    "load",
    "load_instance",
    "memory",
    "special",
    "to_labels",
    "yarn",
]


def label(key: str, value: str) -> resource_pb2.Label:
    """One key=value label message."""
    return resource_pb2.Label(key=key, value=value)


def labels(**kv: str) -> list[resource_pb2.Label]:
    """Label messages from keyword arguments: labels(userCreator="alice-IDE")."""
    return [resource_pb2.Label(key=k, value=v) for k, v in kv.items()]


def labels_from(text: str) -> list[resource_pb2.Label]:
    """Label messages from "k=v,k2=v2" text; ValueError when an item has no '='."""
    return parse_labels(text)


def memory(memory_bytes: int) -> resource_pb2.Resource:
    """A memory-only Resource."""
    return resource_pb2.Resource(memory=resource_pb2.MemoryResource(memory_bytes=memory_bytes))


def cpu(cpu_millis: int) -> resource_pb2.Resource:
    """A CPU-only Resource, in milli-cores."""
    return resource_pb2.Resource(cpu=resource_pb2.CpuResource(cpu_millis=cpu_millis))


def load(memory_bytes: int, cpu_millis: int) -> resource_pb2.Resource:
    """A memory + CPU Resource."""
    return resource_pb2.Resource(
        load=resource_pb2.LoadResource(memory_bytes=memory_bytes, cpu_millis=cpu_millis)
    )


def instance(instances: int) -> resource_pb2.Resource:
    """An instance-count Resource."""
    return resource_pb2.Resource(instance=resource_pb2.InstanceResource(instances=instances))


def load_instance(memory_bytes: int, cpu_millis: int, instances: int) -> resource_pb2.Resource:
    """A memory + CPU + instances Resource (what an ECM offers)."""
    return resource_pb2.Resource(
        load_instance=resource_pb2.LoadInstanceResource(
            memory_bytes=memory_bytes, cpu_millis=cpu_millis, instances=instances
        )
    )


def yarn(
    queue_name: str, memory_bytes: int = 0, cpu_millis: int = 0, instances: int = 0
) -> resource_pb2.Resource:
    """A share of a YARN queue."""
    return resource_pb2.Resource(
        yarn=resource_pb2.YarnResource(
            queue_name=queue_name,
            queue_memory_bytes=memory_bytes,
            queue_cpu_millis=cpu_millis,
            queue_instances=instances,
        )
    )


def special(quantities: Mapping[str, int]) -> resource_pb2.Resource:
    """A custom-resource Resource, for example special({"gpu": 2})."""
    return resource_pb2.Resource(special=resource_pb2.SpecialResource(quantities=dict(quantities)))
