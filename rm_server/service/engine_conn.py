"""EngineConnService: the start-up flow for clients, and the report endpoints for
agents (command stream) and EngineConns (state reports)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from labelrm.v1 import engine_conn_pb2 as pb
from labelrm.v1 import engine_conn_pb2_grpc as pb_grpc

from labelrm_common.durations import duration
from rm_server.app.agents import AgentHub
from rm_server.app.engineconns import CreateRequest, EngineConnManager
from rm_server.domain.engineconn import EcState
from rm_server.errors import InvalidArgument
from rm_server.service import convert
from rm_server.service.common import idempotency, next_token, page_of

MAX_PARAMS = 64


def _ec_id(value: str, field: str = "engine_conn_id") -> str:
    if not value or len(value) > 128:
        raise InvalidArgument(field, "must be 1 to 128 characters")
    return value


def _params(params: dict[str, str]) -> dict[str, str]:
    if len(params) > MAX_PARAMS:
        raise InvalidArgument("params", f"at most {MAX_PARAMS} entries")
    for key, value in params.items():
        if len(key) > 64 or len(value) > 1024:
            raise InvalidArgument(f"params.{key[:64]}", "key or value too long")
    return dict(params)


def _timeout(
    request: pb.CreateEngineConnRequest | pb.AskEngineConnRequest, default: float
) -> float:
    if not request.HasField("timeout"):
        return default
    return convert.duration_seconds(request.timeout, "timeout") or default


def _create_request(
    request: pb.CreateEngineConnRequest | pb.AskEngineConnRequest,
    default_timeout: float,
    method: str,
) -> CreateRequest:
    idem = idempotency(method, request)
    return CreateRequest(
        idem=idem,
        user=request.user,
        labels=convert.labels_from_pb(request.labels),
        params=_params(dict(request.params)),
        timeout=_timeout(request, default_timeout),
    )


class EngineConnServicer(pb_grpc.EngineConnServiceServicer):
    def __init__(self, ecs: EngineConnManager, hub: AgentHub) -> None:
        self.ecs = ecs
        self.hub = hub

    async def CreateEngineConn(
        self, request: pb.CreateEngineConnRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateEngineConnResponse:
        req = _create_request(request, self.ecs.settings.create_timeout, "CreateEngineConn")
        ec = await self.ecs.create(req)
        return pb.CreateEngineConnResponse(
            engine_conn=convert.engine_conn_to_pb(ec, with_secret=True)
        )

    async def AskEngineConn(
        self, request: pb.AskEngineConnRequest, context: grpc.aio.ServicerContext
    ) -> pb.AskEngineConnResponse:
        req = _create_request(request, self.ecs.settings.create_timeout, "AskEngineConn")
        hold = convert.duration_seconds(request.hold, "hold") if request.HasField("hold") else 0
        ec, reused = await self.ecs.ask(req, hold)
        return pb.AskEngineConnResponse(
            engine_conn=convert.engine_conn_to_pb(ec, with_secret=True), reused=reused
        )

    async def GetEngineConn(
        self, request: pb.GetEngineConnRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEngineConnResponse:
        # With the secret: the policy (OWN_ENGINE_CONN) has already refused everyone but
        # the owner, proxy users and admins.
        ec = await self.ecs.get(_ec_id(request.engine_conn_id))
        return pb.GetEngineConnResponse(engine_conn=convert.engine_conn_to_pb(ec, with_secret=True))

    async def ListEngineConns(
        self, request: pb.ListEngineConnsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEngineConnsResponse:
        page = page_of(request)
        state = ""
        if request.state:
            if request.state not in convert.EC_STATE_OF_PB:
                raise InvalidArgument("state", "unknown state")
            state = convert.EC_STATE_OF_PB[request.state].value
        ecs = await self.ecs.list(
            page.after, page.size + 1, request.user, state, request.ecm_instance
        )
        return pb.ListEngineConnsResponse(
            engine_conns=[convert.engine_conn_to_pb(e) for e in ecs[: page.size]],
            next_page_token=next_token(ecs, page, lambda e: e.ec_id),
        )

    async def KillEngineConn(
        self, request: pb.KillEngineConnRequest, context: grpc.aio.ServicerContext
    ) -> pb.KillEngineConnResponse:
        ec = await self.ecs.kill(
            _ec_id(request.engine_conn_id), request.reason[:500] or "killed on request"
        )
        return pb.KillEngineConnResponse(engine_conn=convert.engine_conn_to_pb(ec))

    async def StreamAgentCommands(
        self, request: pb.StreamAgentCommandsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamAgentCommandsResponse]:
        agent_id = _ec_id(request.agent_id, "agent_id")
        async for command in self.ecs.commands_for(agent_id):
            yield pb.StreamAgentCommandsResponse(command=convert.command_to_pb(command))

    async def ReportEngineConnState(
        self, request: pb.ReportEngineConnStateRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportEngineConnStateResponse:
        ec_id = _ec_id(request.engine_conn_id)
        state = convert.EC_STATE_OF_PB.get(request.state)
        if state is None or state in (EcState.STARTING, EcState.LOST):
            raise InvalidArgument("state", "must be IDLE, BUSY, SHUTTING_DOWN, SUCCEEDED or FAILED")
        if len(request.address) > 300:
            raise InvalidArgument("address", "too long")
        if request.HasField("used_resource"):
            # Its ticket charges what was granted; what it uses, its agent measures from
            # its cgroup. An EngineConn's word would let it lower its own charge.
            raise InvalidArgument(
                "used_resource",
                "an EngineConn does not report its usage: its agent measures it; leave it unset",
            )
        shutdown = await self.hub.report_state(ec_id, state, request.address, request.reason[:2000])
        interval = duration(self.ecs.settings.ec_heartbeat_interval)
        return pb.ReportEngineConnStateResponse(shutdown=shutdown, heartbeat_interval=interval)
