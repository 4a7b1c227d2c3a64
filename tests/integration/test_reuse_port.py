"""reuse_port: several rm-server processes (replicas) on one host share the ports."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc

from bench.serving import free_port
from rm_server.config import Settings
from rm_server.server import RMServer
from tests.support.messages import GiB, load_instance, register
from tests.support.rm import start_in_process, stop_in_process


async def test_replicas_share_the_port_only_with_reuse_port(database_url):
    port = free_port()
    listen = f"127.0.0.1:{port}"
    first = await start_in_process(database_url, listen=listen, reuse_port=True)
    try:
        second = await start_in_process(database_url, listen=listen, reuse_port=True)
        try:
            assert (first.server.port, second.server.port) == (port, port)
            # Fresh connections land on either replica; all see one database.
            await first.rm.RegisterEcm(register("h1:9000", load_instance(GiB, 1000, 1)))
            for _ in range(8):
                async with grpc.aio.insecure_channel(listen) as channel:
                    health = health_pb2_grpc.HealthStub(channel)
                    status = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                    assert status.status == health_pb2.HealthCheckResponse.SERVING
                    rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
                    ecms = await rm.ListEcms(pb.ListEcmsRequest(), timeout=5)
                    assert [e.instance for e in ecms.ecms] == ["h1:9000"]
        finally:
            await stop_in_process(second)
        # Without reuse_port the port stays the first replica's.
        third = RMServer(Settings(database_url=database_url, listen=listen, shutdown_grace=0.5))
        with pytest.raises((OSError, RuntimeError), match=r"(?i)bind|listen"):
            await asyncio.wait_for(third.start(), 60)  # it stops what it started
    finally:
        await stop_in_process(first)
