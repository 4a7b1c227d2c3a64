"""ResourceManagerService: ECM registration and the apply / report / release lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import Message
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc as pb_grpc

from rm_server.app.agents import AgentHub
from rm_server.app.core import RMCore
from rm_server.domain.engineconn import HeartbeatOutcome
from rm_server.domain.labels import EM_INSTANCE, Label, LabelKey
from rm_server.domain.model import LabelResource, Registration, Ticket
from rm_server.domain.resources import Resource
from rm_server.errors import InvalidArgument
from rm_server.service import convert, convert_engineconn
from rm_server.service.common import ProtoEncoder, idempotency, next_token, page_of, respond


def _ticket_encoder(response_type: type[Message]) -> ProtoEncoder[Ticket]:
    """For the responses that carry one `ticket` (Apply, ReportUsed, Release)."""

    def encode(ticket: Ticket) -> Message:
        response = response_type()
        convert.fill_ticket(response.ticket, ticket)  # type: ignore[attr-defined]
        return response

    return ProtoEncoder[Ticket](encode)


_TICKET_ENCODERS = {
    "Apply": _ticket_encoder(pb.ApplyResponse),
    "ReportUsed": _ticket_encoder(pb.ReportUsedResponse),
    "Release": _ticket_encoder(pb.ReleaseResponse),
}
_REGISTER = ProtoEncoder[Registration](
    lambda r: pb.RegisterEcmResponse(
        ecm=convert_engineconn.ecm_to_pb(r.ecm), resource_changed=r.resource_changed
    )
)
_UNREGISTER = ProtoEncoder[list[str]](lambda ids: pb.UnregisterEcmResponse(released_ticket_ids=ids))

_STATE_FILTER = {
    pb.TICKET_STATE_UNSPECIFIED: "",
    pb.TICKET_STATE_LOCKED: "LOCKED",
    pb.TICKET_STATE_USED: "USED",
}


def _ticket_id(value: str) -> str:
    if not value or len(value) > 128:
        raise InvalidArgument("ticket_id", "must be 1 to 128 characters")
    return value


def _instance(value: str, field: str = "instance") -> str:
    with convert.field_of(field):
        return Label(EM_INSTANCE, value).value


# Agent ids already validated: every beat of a fleet names one of a few thousand, and
# validating a label costs a heartbeat as much as building its answer. Bounded: emptied
# when full.
_AGENT_IDS_SEEN: set[str] = set()
MAX_AGENT_IDS_SEEN = 65536


def _agent_id(value: str, field: str) -> str:
    """A heartbeat's agent id: an ECM instance (`_instance`), validated once per process."""
    if value in _AGENT_IDS_SEEN:
        return value
    checked = _instance(value, field)
    if len(_AGENT_IDS_SEEN) >= MAX_AGENT_IDS_SEEN:
        _AGENT_IDS_SEEN.clear()
    _AGENT_IDS_SEEN.add(checked)
    return checked


class ResourceManagerServicer(pb_grpc.ResourceManagerServiceServicer):
    def __init__(self, core: RMCore, hub: AgentHub) -> None:
        self.core = core
        self.hub = hub

    async def RegisterEcm(
        self, request: pb.RegisterEcmRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterEcmResponse:
        instance = _instance(request.instance)
        labels = convert.labels_from_pb(request.labels, required=False)
        total = convert.resource_from_pb(request.total_resource, "total_resource")
        protected = (
            convert.resource_in_kind(
                convert.resource_from_pb(request.protected_resource, "protected_resource"),
                total.kind,
                "protected_resource",
            )
            if request.HasField("protected_resource")
            else Resource.zero(total.kind, total.queue)
        )
        isolation = (
            convert_engineconn.isolation_from_pb(request.isolation, "isolation")
            if request.HasField("isolation")
            else None
        )
        outcome = await self.core.capacity.register_ecm(
            idempotency("RegisterEcm", request),
            instance,
            labels,
            total,
            protected,
            _REGISTER,
            isolation,
        )
        return respond(outcome, _REGISTER, pb.RegisterEcmResponse)

    async def UnregisterEcm(
        self, request: pb.UnregisterEcmRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterEcmResponse:
        instance = _instance(request.instance)
        outcome = await self.core.capacity.unregister_ecm(
            idempotency("UnregisterEcm", request), instance, _UNREGISTER
        )
        return respond(outcome, _UNREGISTER, pb.UnregisterEcmResponse)

    async def Apply(
        self, request: pb.ApplyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ApplyResponse:
        labels = convert.labels_from_pb(request.labels)
        resource = convert.resource_from_pb(request.resource, "resource")
        wait = convert.duration_seconds(request.wait_timeout, "wait_timeout")
        if len(request.user) > 64:
            raise InvalidArgument("user", "must be at most 64 characters")
        encoder = _TICKET_ENCODERS["Apply"].fresh()
        outcome = await self.core.tickets.apply(
            idempotency("Apply", request), request.user, labels, resource, wait, encoder
        )
        return respond(outcome, encoder, pb.ApplyResponse)

    async def ReportUsed(
        self, request: pb.ReportUsedRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportUsedResponse:
        ticket_id = _ticket_id(request.ticket_id)
        used = (
            convert.resource_from_pb(request.used_resource, "used_resource")
            if request.HasField("used_resource")
            else None
        )
        encoder = _TICKET_ENCODERS["ReportUsed"].fresh()
        outcome = await self.core.tickets.report_used(
            idempotency("ReportUsed", request), ticket_id, used, encoder
        )
        return respond(outcome, encoder, pb.ReportUsedResponse)

    async def Release(
        self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseResponse:
        ticket_id = _ticket_id(request.ticket_id)
        encoder = _TICKET_ENCODERS["Release"].fresh()
        outcome = await self.core.tickets.release(
            idempotency("Release", request), ticket_id, encoder
        )
        return respond(outcome, encoder, pb.ReleaseResponse)

    async def GetTicket(
        self, request: pb.GetTicketRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTicketResponse:
        ticket = await self.core.tickets.get_ticket(_ticket_id(request.ticket_id))
        response = pb.GetTicketResponse()
        convert.fill_ticket(response.ticket, ticket)
        return response

    async def ListTickets(
        self, request: pb.ListTicketsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTicketsResponse:
        page = page_of(request)
        if request.state not in _STATE_FILTER:
            raise InvalidArgument("state", "only LOCKED or USED tickets are live")
        label = _label_text(request.label, "label") if request.label else ""
        state = _STATE_FILTER[request.state]
        if len(request.user) > 64:
            raise InvalidArgument("user", "must be at most 64 characters")
        # `user` is set by the access policy for every caller but admins.
        tickets = await self.core.tickets.list_tickets(
            page.after, page.size + 1, label, state, request.user or None
        )
        response = pb.ListTicketsResponse(
            next_page_token=next_token(tickets, page, lambda t: t.ticket_id)
        )
        for ticket in tickets[: page.size]:
            convert.fill_ticket(response.tickets.add(), ticket)
        return response

    async def GetLabelResource(
        self, request: pb.GetLabelResourceRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLabelResourceResponse:
        labels = convert.labels_from_pb(request.labels)
        record = await self.core.capacity.get_label_resource(str(LabelKey(labels)))
        response = pb.GetLabelResourceResponse()
        await self._fill_record(response.label_resource, record)
        return response

    async def ListLabelResources(
        self, request: pb.ListLabelResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListLabelResourcesResponse:
        page = page_of(request)
        if request.source not in ("", "ecm", "limit", "external"):
            raise InvalidArgument("source", "must be empty, 'ecm', 'limit' or 'external'")
        records = await self.core.capacity.list_label_resources(
            page.after, page.size + 1, request.source
        )
        response = pb.ListLabelResourcesResponse(
            next_page_token=next_token(records, page, lambda r: r.label)
        )
        add = response.label_resources.add
        for record in records[: page.size]:
            await self._fill_record(add(), record)
        return response

    async def _fill_record(self, msg: pb.LabelResource, record: LabelResource) -> None:
        """A label record into an empty message; an external queue's with YARN's figures
        beside labelrm's."""
        convert.fill_label_resource(msg, record)
        if record.source == "external" and self.core.external is not None:
            found = await self.core.external.label_view(record.label, record.locked)
            if found is not None:
                msg.external_queue.CopyFrom(convert.queue_view_to_pb(*found))

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        response = pb.HeartbeatResponse()
        await self._heartbeat(request, response)
        return response

    async def HeartbeatStream(
        self,
        requests: AsyncIterator[pb.HeartbeatStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.HeartbeatStreamResponse]:
        """Heartbeat, one message at a time on one long-lived call, answered in order. A
        message Heartbeat would refuse ends the stream with that status."""
        async for request in requests:
            response = pb.HeartbeatStreamResponse()
            await self._heartbeat(request.heartbeat, response.heartbeat, "heartbeat.")
            yield response

    async def _heartbeat(
        self, request: pb.HeartbeatRequest, out: pb.HeartbeatResponse, at: str = ""
    ) -> None:
        """One heartbeat, its answer written into `out` (in place: a copy into the
        stream's message would cost as much again); `at`: where it sits in the request,
        for the field an error names."""
        agent_id = _agent_id(request.agent_id, f"{at}agent_id")
        if request.sequence < 1:
            raise InvalidArgument(f"{at}sequence", "must be >= 1")
        # How many reports and done ids: bounded (service.bounds) before the request got here.
        processes = [
            convert_engineconn.process_from_pb(p, f"{at}engine_conns[{i}]")
            for i, p in enumerate(request.engine_conns)
        ]
        interval = self.hub.settings.agent_heartbeat_interval
        encoded_here = False

        def encode(outcome: HeartbeatOutcome) -> bytes:
            # The answer is built once, where it is sent, and its bytes stored as this
            # sequence's answer (for a resend).
            nonlocal encoded_here
            encoded_here = True
            out.Clear()
            convert_engineconn.fill_heartbeat(out, outcome, interval)
            encoded: bytes = out.SerializeToString()
            return encoded

        outcome = await self.hub.heartbeat(
            agent_id, request.sequence, processes, list(request.done_command_ids), encode
        )
        if encoded_here:  # answered now: `out` holds the answer stored for this sequence
            return
        if isinstance(outcome, bytes):  # a resend: the previous answer, verbatim
            out.MergeFromString(outcome)
        else:
            convert_engineconn.fill_heartbeat(out, outcome, interval)

    async def GetEcm(
        self, request: pb.GetEcmRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEcmResponse:
        status = await self.hub.ecm_status(_instance(request.instance))
        return pb.GetEcmResponse(ecm=convert_engineconn.ecm_status_to_pb(status))

    async def ListEcms(
        self, request: pb.ListEcmsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEcmsResponse:
        page = page_of(request)
        ecms = await self.hub.list_ecm_status(page.after, page.size + 1)
        return pb.ListEcmsResponse(
            ecms=[convert_engineconn.ecm_status_to_pb(e) for e in ecms[: page.size]],
            next_page_token=next_token(ecms, page, lambda e: e.instance),
        )


def _label_text(text: str, field: str) -> str:
    with convert.field_of(field):
        return str(LabelKey.parse(text))
