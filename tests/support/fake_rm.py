"""A stand-in RM for EngineConns run without one."""

from __future__ import annotations

import asyncio
from typing import Any

from labelrm.v1 import (
    engine_conn_pb2,
    engine_conn_pb2_grpc,
)

from tests.support.waiting import wait_until


class FakeRM(engine_conn_pb2_grpc.EngineConnServiceServicer):  # type: ignore[misc]  # grpc: untyped
    """The RM's EngineConn service as the EngineConns see it: records every state report
    (in order in `reports`, and for `next_report`), answers shutdown=true once told to.
    The `fake_rm` fixture (tests/fixtures/engineconns.py) serves one on `target`."""

    def __init__(self) -> None:
        self.reports: list[engine_conn_pb2.ReportEngineConnStateRequest] = []
        self._unread: asyncio.Queue[engine_conn_pb2.ReportEngineConnStateRequest] = asyncio.Queue()
        self.shutdown = False
        self.target = ""

    async def ReportEngineConnState(
        self, request: engine_conn_pb2.ReportEngineConnStateRequest, context: Any
    ) -> engine_conn_pb2.ReportEngineConnStateResponse:
        self.reports.append(request)
        await self._unread.put(request)
        return engine_conn_pb2.ReportEngineConnStateResponse(shutdown=self.shutdown)

    def report(self, ec_id: str, state: int) -> engine_conn_pb2.ReportEngineConnStateRequest | None:
        """The first report of `ec_id` in `state`, if any came."""
        for r in self.reports:
            if r.engine_conn_id == ec_id and r.state == state:
                return r
        return None

    async def next_report(
        self, state: int, timeout: float = 5.0
    ) -> engine_conn_pb2.ReportEngineConnStateRequest:
        """The next report not read yet in `state` (earlier ones in other states are
        skipped)."""
        name = engine_conn_pb2.EngineConnState.Name
        seen: list[str] = []

        async def in_state() -> engine_conn_pb2.ReportEngineConnStateRequest | None:
            while not self._unread.empty():
                report = self._unread.get_nowait()
                if report.state == state:
                    return report
                seen.append(name(report.state))
            return None

        found: engine_conn_pb2.ReportEngineConnStateRequest = await wait_until(
            in_state, timeout, what=lambda: f"a {name(state)} report; saw {seen}", interval=0.02
        )
        return found
