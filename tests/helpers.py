"""Message builders shared by the integration tests."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import admin_pb2, resource_manager_pb2, resource_pb2

GiB = 1024**3


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


def register(instance: str, total: resource_pb2.Resource, protected=None, request_id=""):
    return resource_manager_pb2.RegisterEcmRequest(
        request_id=request_id,
        instance=instance,
        total_resource=total,
        protected_resource=protected,
    )


def apply_req(labels: str, resource, request_id: str = "", wait: float = 0.0, user: str = ""):
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


def limit_req(pattern: str, resource, request_id: str = ""):
    return admin_pb2.SetLabelLimitRequest(
        request_id=request_id, labels=lbl(pattern), max_resource=resource
    )


async def beat_on_stream(
    stream, request: resource_manager_pb2.HeartbeatRequest
) -> resource_manager_pb2.HeartbeatResponse:
    """Send one heartbeat on an open HeartbeatStream and read its answer."""
    import grpc

    await stream.write(resource_manager_pb2.HeartbeatStreamRequest(heartbeat=request))
    answer = await stream.read()
    assert answer is not grpc.aio.EOF, "the stream ended"
    response: resource_manager_pb2.HeartbeatResponse = answer.heartbeat
    return response


async def label_state(rm, labels: str) -> resource_manager_pb2.LabelResource:
    resp = await rm.rm.GetLabelResource(
        resource_manager_pb2.GetLabelResourceRequest(labels=lbl(labels))
    )
    return resp.label_resource


async def assert_consistent(rm) -> admin_pb2.CheckConsistencyResponse:
    report = await rm.admin.CheckConsistency(admin_pb2.CheckConsistencyRequest())
    assert report.consistent, [str(m) for m in report.mismatches]
    return report
