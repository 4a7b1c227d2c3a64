"""An RM a test starts in its own process, and what it holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from labelrm.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    resource_manager_pb2,
    resource_manager_pb2_grpc,
)

from rm_server.clock import Clock, SystemClock
from rm_server.config import Settings
from rm_server.server import RMServer
from tests.support.messages import lbl


async def beat_on_stream(
    stream: Any, request: resource_manager_pb2.HeartbeatRequest
) -> resource_manager_pb2.HeartbeatResponse:
    """Send one heartbeat on an open HeartbeatStream and read its answer."""
    import grpc

    await stream.write(resource_manager_pb2.HeartbeatStreamRequest(heartbeat=request))
    answer = await stream.read()
    assert answer is not grpc.aio.EOF, "the stream ended"
    response: resource_manager_pb2.HeartbeatResponse = answer.heartbeat
    return response


async def label_state(rm: Any, labels: str) -> resource_manager_pb2.LabelResource:
    resp = await rm.rm.GetLabelResource(
        resource_manager_pb2.GetLabelResourceRequest(labels=lbl(labels))
    )
    return resp.label_resource


async def assert_consistent(rm: Any) -> admin_pb2.CheckConsistencyResponse:
    report = await rm.admin.CheckConsistency(admin_pb2.CheckConsistencyRequest())
    assert report.consistent, [str(m) for m in report.mismatches]
    return report


@dataclass
class InProcessRM:
    server: RMServer
    channel: grpc.aio.Channel
    rm: resource_manager_pb2_grpc.ResourceManagerServiceStub
    admin: admin_pb2_grpc.AdminServiceStub
    clock: Clock
    database_url: str

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def core(self) -> Any:
        return self.server.core


async def start_in_process(
    database_url: str, clock: Clock | None = None, **overrides: Any
) -> InProcessRM:
    """An RMServer in this process on a free port, with a channel and stubs to it; one
    process even with `agent_listen` (tests look into its parts), unless overridden."""
    overrides = {
        "listen": "127.0.0.1:0",
        "shutdown_grace": 0.5,
        "agent_process": False,
        **overrides,
    }
    settings = Settings(database_url=database_url, **overrides)
    server = RMServer(settings, clock=clock or SystemClock())
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    return InProcessRM(
        server,
        channel,
        resource_manager_pb2_grpc.ResourceManagerServiceStub(channel),
        admin_pb2_grpc.AdminServiceStub(channel),
        clock or server.clock,
        database_url,
    )


async def stop_in_process(rm: InProcessRM) -> None:
    await rm.channel.close()
    await rm.server.stop(grace=0.5)


async def snapshot(rm: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every label record and ticket, as JSON dicts (to compare before and after)."""
    from google.protobuf import json_format

    records = await rm.rm.ListLabelResources(resource_manager_pb2.ListLabelResourcesRequest())
    tickets = await rm.rm.ListTickets(resource_manager_pb2.ListTicketsRequest())
    return json_format.MessageToDict(records), json_format.MessageToDict(tickets)
