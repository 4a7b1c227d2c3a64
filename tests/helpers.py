"""Message builders and the polling helper shared by the tests."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

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


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    *,
    what: str = "condition",
    interval: float = 0.05,
) -> Any:
    """Poll `predicate` (a plain or an async function) until it returns a truthy value,
    which is returned; at the deadline fail naming `what` and the last value seen.
    The one way the tests wait for something to happen: never a bare sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what} (last: {value!r})")
        await asyncio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], Any], timeout: float = 20.0, *, what: str = "condition"
) -> Any:
    """`wait_until` for tests without an event loop (blocking, 0.1 s between tries)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what} (last: {value!r})")
        time.sleep(0.1)
