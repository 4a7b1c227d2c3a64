"""AdminService: label limits and the consistency check."""

from __future__ import annotations

import re

import grpc
from labelrm.v1 import admin_pb2 as pb
from labelrm.v1 import admin_pb2_grpc as pb_grpc

from labelrm_common.version import VERSION
from rm_server.app.agents import AgentHub
from rm_server.app.cluster import EVENT_TABLES
from rm_server.app.core import RMCore
from rm_server.domain.external import ProviderConfig
from rm_server.domain.labels import EM_INSTANCE
from rm_server.domain.model import StoredLimit
from rm_server.errors import FailedPrecondition, InvalidArgument
from rm_server.external import ExternalResources
from rm_server.service import convert
from rm_server.service.common import ProtoEncoder, idempotency, next_token, page_of, respond

_SET = ProtoEncoder[tuple[StoredLimit, int]](
    lambda r: pb.SetLabelLimitResponse(limit=convert.limit_to_pb(r[0]), affected_labels=r[1])
)
_DELETE = ProtoEncoder[int](lambda n: pb.DeleteLabelLimitResponse(affected_labels=n))
_PUT_PROVIDER = ProtoEncoder[ProviderConfig](
    lambda p: pb.PutExternalProviderResponse(provider=convert.provider_to_pb(p))
)
_DELETE_PROVIDER = ProtoEncoder[ProviderConfig](
    lambda p: pb.DeleteExternalProviderResponse(provider=convert.provider_to_pb(p))
)


class AdminServicer(pb_grpc.AdminServiceServicer):
    def __init__(self, core: RMCore, hub: AgentHub, database_url: str = "") -> None:
        self.core = core
        self.hub = hub
        self.database_url = database_url  # empty: the embedded PostgreSQL

    async def SetLabelLimit(
        self, request: pb.SetLabelLimitRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetLabelLimitResponse:
        pattern = convert.pattern_from_pb(request.labels)
        if tuple(k for k, _ in pattern.labels) == (EM_INSTANCE,):
            # An ECM's record holds its registered capacity; a limit there would be
            # stored and never read (or, on an unregistered ECM, make a record of its own).
            raise InvalidArgument(
                "labels",
                "emInstance labels take no limit: an ECM's capacity is its registration"
                " (RegisterEcm total_resource)",
            )
        maximum = convert.resource_from_pb(request.max_resource, "max_resource")
        outcome = await self.core.capacity.set_limit(
            idempotency("SetLabelLimit", request), pattern, maximum, _SET
        )
        return respond(outcome, _SET, pb.SetLabelLimitResponse)

    async def ListLabelLimits(
        self, request: pb.ListLabelLimitsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListLabelLimitsResponse:
        page = page_of(request)
        limits = await self.core.capacity.list_limits(page.after, page.size + 1)
        return pb.ListLabelLimitsResponse(
            limits=[convert.limit_to_pb(lim) for lim in limits[: page.size]],
            next_page_token=next_token(limits, page, lambda lim: lim.pattern),
        )

    async def DeleteLabelLimit(
        self, request: pb.DeleteLabelLimitRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteLabelLimitResponse:
        pattern = convert.pattern_from_pb(request.labels)
        outcome = await self.core.capacity.delete_limit(
            idempotency("DeleteLabelLimit", request), pattern, _DELETE
        )
        return respond(outcome, _DELETE, pb.DeleteLabelLimitResponse)

    async def CheckConsistency(
        self, request: pb.CheckConsistencyRequest, context: grpc.aio.ServicerContext
    ) -> pb.CheckConsistencyResponse:
        return convert.report_to_pb(await self.core.consistency.check())

    async def RefreshNodes(
        self, request: pb.RefreshNodesRequest, context: grpc.aio.ServicerContext
    ) -> pb.RefreshNodesResponse:
        for field in ("include", "exclude"):
            for i, entry in enumerate(getattr(request, field)):
                if not _NODE_RE.fullmatch(entry):
                    raise InvalidArgument(f"{field}[{i}]", "must be a host or host:port")
        disallowed = await self.hub.refresh_nodes(list(request.include), list(request.exclude))
        return pb.RefreshNodesResponse(disallowed_instances=disallowed)

    async def DecommissionEcm(
        self, request: pb.DecommissionEcmRequest, context: grpc.aio.ServicerContext
    ) -> pb.DecommissionEcmResponse:
        if not _NODE_RE.fullmatch(request.instance):
            raise InvalidArgument("instance", "must be an ECM instance")
        live = await self.hub.decommission(request.instance)
        return pb.DecommissionEcmResponse(live_engine_conns=live)

    async def CordonEcm(
        self, request: pb.CordonEcmRequest, context: grpc.aio.ServicerContext
    ) -> pb.CordonEcmResponse:
        if not _NODE_RE.fullmatch(request.instance):
            raise InvalidArgument("instance", "must be an ECM instance")
        status = await self.hub.cordon(request.instance, True, request.reason[:500])
        return pb.CordonEcmResponse(ecm=convert.ecm_status_to_pb(status))

    async def UncordonEcm(
        self, request: pb.UncordonEcmRequest, context: grpc.aio.ServicerContext
    ) -> pb.UncordonEcmResponse:
        if not _NODE_RE.fullmatch(request.instance):
            raise InvalidArgument("instance", "must be an ECM instance")
        status = await self.hub.cordon(request.instance, False)
        return pb.UncordonEcmResponse(ecm=convert.ecm_status_to_pb(status))

    def _external(self) -> ExternalResources:
        if self.core.external is None:
            raise FailedPrecondition("external resources are off", state="DISABLED")
        return self.core.external

    async def PutExternalProvider(
        self, request: pb.PutExternalProviderRequest, context: grpc.aio.ServicerContext
    ) -> pb.PutExternalProviderResponse:
        provider = convert.provider_from_pb(request.provider)
        # The request log keeps a hash of the request: not of one holding the password.
        keyed = pb.PutExternalProviderRequest()
        keyed.CopyFrom(request)
        keyed.provider.ClearField("password")
        outcome = await self._external().put_provider(
            idempotency("PutExternalProvider", keyed), provider, _PUT_PROVIDER
        )
        return respond(outcome, _PUT_PROVIDER, pb.PutExternalProviderResponse)

    async def ListExternalProviders(
        self, request: pb.ListExternalProvidersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListExternalProvidersResponse:
        providers = await self._external().list_providers()
        return pb.ListExternalProvidersResponse(
            providers=[convert.provider_to_pb(p) for p in providers]
        )

    async def DeleteExternalProvider(
        self, request: pb.DeleteExternalProviderRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteExternalProviderResponse:
        if not request.name:
            raise InvalidArgument("name", "is required")
        outcome = await self._external().delete_provider(
            idempotency("DeleteExternalProvider", request), request.name, _DELETE_PROVIDER
        )
        return respond(outcome, _DELETE_PROVIDER, pb.DeleteExternalProviderResponse)

    async def TestExternalProvider(
        self, request: pb.TestExternalProviderRequest, context: grpc.aio.ServicerContext
    ) -> pb.TestExternalProviderResponse:
        if not request.name:
            raise InvalidArgument("name", "is required")
        snap, views = await self._external().test_provider(request.name)
        return pb.TestExternalProviderResponse(
            active_address=snap.active_address,
            scheduler=snap.scheduler.value,
            queues=[convert.queue_view_to_pb(v, snap) for v in views],
        )

    async def GetClusterInfo(
        self, request: pb.GetClusterInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetClusterInfoResponse:
        row = await self.core.cluster.info()
        out = pb.GetClusterInfoResponse(
            version=VERSION,
            database=_database(self.database_url, row.server_version),
            waiting_applies=row.waiting_applies,
            liveness=convert.liveness_to_pb(await self.hub.liveness()),
        )
        out.time.FromDatetime(self.core.clock.now())
        for r in row.replicas:
            replica = out.replicas.add(replica_id=r.replica_id, host=r.host, pid=r.pid)
            replica.start_time.FromDatetime(r.started_at)
        return out

    async def ListEvents(
        self, request: pb.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEventsResponse:
        if request.kind not in EVENT_TABLES:
            raise InvalidArgument("kind", f"must be one of {', '.join(sorted(EVENT_TABLES))}")
        if not request.id or len(request.id) > 256:
            raise InvalidArgument("id", f"must be the id of a {request.kind}")
        if len(request.user) > 256:
            raise InvalidArgument("user", "must be a user name")
        rows = await self.core.cluster.events(request.kind, request.id, request.user)
        out = pb.ListEventsResponse()
        for at, state, reason in rows:
            event = out.events.add(state=state, reason=reason)
            event.time.FromDatetime(at)
        return out


def _database(url: str, version: str) -> str:
    """ "embedded PostgreSQL 16.4", or "external PostgreSQL 15.8 (db1:5432,db2:5432)": the
    hosts only, never a user or password."""
    if not url:
        return f"embedded PostgreSQL {version}"
    hosts = re.search(r"@([^/?]+)", url) or re.search(r"host=([^\s]+)", url)
    where = f" ({hosts.group(1)})" if hosts else ""
    return f"external PostgreSQL {version}{where}"


_NODE_RE = re.compile(r"[A-Za-z0-9_.-]{1,253}(:[0-9]{1,5})?")
