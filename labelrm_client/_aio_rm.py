"""Tickets, label records, limits, providers, events and usage: ResourceManagerService,
AdminService and UsageService methods of the clients (the async module is the source of the blocking
one: scripts/gen_sync_client.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from labelrm.v1 import admin_pb2, external_pb2, resource_manager_pb2, usage_pb2

from labelrm_client import _requests as rq
from labelrm_client._aio_base import AsyncClientBase
from labelrm_client._requests import LabelsLike, StateLike, to_labels


class AsyncRMCalls(AsyncClientBase):
    """ResourceManagerService (tickets, label records) and AdminService (limits,
    providers, consistency, events, cluster info) methods."""

    # --- ResourceManagerService -----------------------------------------------------------------

    async def register_ecm(
        self,
        instance: str,
        total: Any,
        protected: Any = None,
        labels: LabelsLike = (),
        request_id: str | None = None,
    ) -> resource_manager_pb2.Ecm:
        """Register (or re-register) an ECM with its total resource; returns the Ecm."""
        req = rq.register_ecm(instance, total, protected, labels, request_id)
        return (await self._call(self._rm.RegisterEcm, req)).ecm

    async def unregister_ecm(self, instance: str, request_id: str | None = None) -> list[str]:
        """Unregister an ECM; returns the ids of the tickets that were released."""
        req = rq.unregister_ecm(instance, request_id)
        return list((await self._call(self._rm.UnregisterEcm, req)).released_ticket_ids)

    async def apply(
        self,
        labels: LabelsLike,
        resource: Any,
        wait_timeout: float = 0,
        user: str = "",
        request_id: str | None = None,
    ) -> resource_manager_pb2.Ticket:
        """Lock `resource` on every resource-carrying label; returns the LOCKED Ticket.

        With wait_timeout > 0 the server waits up to that many seconds for room.
        """
        req = rq.apply(labels, resource, wait_timeout, user, request_id)
        return (await self._call(self._rm.Apply, req, wait_timeout + self.timeout)).ticket

    async def report_used(
        self, ticket_id: str, used: Any = None, request_id: str | None = None
    ) -> resource_manager_pb2.Ticket:
        """Turn a LOCKED ticket into USED (all of it when `used` is None); returns the Ticket."""
        req = rq.report_used(ticket_id, used, request_id)
        return (await self._call(self._rm.ReportUsed, req)).ticket

    async def release(
        self, ticket_id: str, request_id: str | None = None
    ) -> resource_manager_pb2.Ticket:
        """Release a ticket (idempotent); returns the finished Ticket."""
        req = rq.release(ticket_id, request_id)
        return (await self._call(self._rm.Release, req)).ticket

    async def get_ticket(self, ticket_id: str) -> resource_manager_pb2.Ticket:
        """The Ticket with this id (live or finished)."""
        req = resource_manager_pb2.GetTicketRequest(ticket_id=ticket_id)
        return (await self._call(self._rm.GetTicket, req)).ticket

    async def list_tickets(
        self, label: LabelsLike = "", state: StateLike = None, page_size: int = 0
    ) -> list[resource_manager_pb2.Ticket]:
        """Every live Ticket (all pages, fetched by the call), optionally charged to `label`
        / in `state`."""
        req = rq.list_tickets(label, state, page_size)
        return await self._pages(self._rm.ListTickets, req, "tickets")

    async def get_label_resource(self, labels: LabelsLike) -> resource_manager_pb2.LabelResource:
        """The LabelResource record of one resource-carrying label (or combination)."""
        req = resource_manager_pb2.GetLabelResourceRequest(labels=to_labels(labels))
        return (await self._call(self._rm.GetLabelResource, req)).label_resource

    async def list_label_resources(
        self, source: str = "", page_size: int = 0
    ) -> list[resource_manager_pb2.LabelResource]:
        """Every LabelResource (all pages, fetched by the call), only "ecm" or "limit"
        records when `source` is set."""
        req = resource_manager_pb2.ListLabelResourcesRequest(page_size=page_size, source=source)
        return await self._pages(self._rm.ListLabelResources, req, "label_resources")

    # --- AdminService ---------------------------------------------------------------------------

    async def set_label_limit(
        self, labels: LabelsLike, max_resource: Any, request_id: str | None = None
    ) -> admin_pb2.LabelLimit:
        """Create or replace the limit of a label pattern ("*" allowed); returns the LabelLimit."""
        req = rq.set_label_limit(labels, max_resource, request_id)
        return (await self._call(self._admin.SetLabelLimit, req)).limit

    async def list_label_limits(self, page_size: int = 0) -> list[admin_pb2.LabelLimit]:
        """Every LabelLimit (all pages, fetched by the call)."""
        req = admin_pb2.ListLabelLimitsRequest(page_size=page_size)
        return await self._pages(self._admin.ListLabelLimits, req, "limits")

    async def delete_label_limit(self, labels: LabelsLike, request_id: str | None = None) -> int:
        """Delete the limit of a label pattern; returns how many label records changed."""
        req = rq.delete_label_limit(labels, request_id)
        return int((await self._call(self._admin.DeleteLabelLimit, req)).affected_labels)

    async def put_external_provider(
        self, provider: external_pb2.ExternalProvider, request_id: str | None = None
    ) -> external_pb2.ExternalProvider:
        """Create or replace an external resource provider (an external_pb2.ExternalProvider);
        returns it as stored, without its password."""
        req = admin_pb2.PutExternalProviderRequest(
            request_id=rq.request_id(request_id), provider=provider
        )
        return (await self._call(self._admin.PutExternalProvider, req)).provider

    async def list_external_providers(self) -> list[external_pb2.ExternalProvider]:
        """Every external resource provider (without passwords)."""
        req = admin_pb2.ListExternalProvidersRequest()
        return list((await self._call(self._admin.ListExternalProviders, req)).providers)

    async def delete_external_provider(
        self, name: str, request_id: str | None = None
    ) -> external_pb2.ExternalProvider:
        """Remove a provider; returns it."""
        req = admin_pb2.DeleteExternalProviderRequest(
            request_id=rq.request_id(request_id), name=name
        )
        return (await self._call(self._admin.DeleteExternalProvider, req)).provider

    async def test_external_provider(self, name: str) -> admin_pb2.TestExternalProviderResponse:
        """Fetch a provider's live figures now: the TestExternalProviderResponse."""
        req = admin_pb2.TestExternalProviderRequest(name=name)
        return await self._call(self._admin.TestExternalProvider, req)

    async def check_consistency(self) -> admin_pb2.CheckConsistencyResponse:
        """Recompute every label's used and locked; returns the CheckConsistencyResponse."""
        req = admin_pb2.CheckConsistencyRequest()
        return await self._call(self._admin.CheckConsistency, req)

    async def list_events(
        self, kind: str, object_id: str, user: str = ""
    ) -> list[admin_pb2.StateEvent]:
        """The state history (StateEvent: time, state, reason) of a "node", an
        "engineconn", a "ticket" or a "demand" (of `user`, if several have that id),
        oldest first."""
        req = admin_pb2.ListEventsRequest(kind=kind, id=object_id, user=user)
        return list((await self._call(self._admin.ListEvents, req)).events)

    async def get_cluster_info(self) -> admin_pb2.GetClusterInfoResponse:
        """The RM's version, replicas, database and waiting applies (GetClusterInfoResponse)."""
        return await self._call(self._admin.GetClusterInfo, admin_pb2.GetClusterInfoRequest())

    # --- UsageService -------------------------------------------------------------------------

    async def get_usage(
        self,
        group_by: str = "user",
        since: datetime | None = None,
        until: datetime | None = None,
        user: str = "",
        page_size: int = 0,
    ) -> list[usage_pb2.UsageRow]:
        """The usage ledger summed over whole hours [since, until) (default: the last 7
        days) by "user", "label", "engine_type", "user_creator" or "hour": every UsageRow
        (all pages), granted against measured. A user gets their own usage only."""
        req = rq.get_usage(group_by, since, until, user, page_size)
        return await self._pages(self._usage.GetUsage, req, "rows")
