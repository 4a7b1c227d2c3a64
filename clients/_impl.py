"""Sync and async labelrm clients: request building, deadlines, retries, typed errors."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeAlias

import grpc
from google.protobuf import duration_pb2
from labelrm.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    engine_conn_pb2_grpc,
    resource_manager_pb2,
    resource_manager_pb2_grpc,
    resource_pb2,
)
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from clients._channel import ChannelSecurity, aio_channel, sync_channel
from clients._engineconn import AsyncEngineConnCalls, EngineConnCalls
from clients._errors import from_rpc_error

DEFAULT_TARGET = "127.0.0.1:7100"

LabelsLike: TypeAlias = "Sequence[resource_pb2.Label] | Mapping[str, str] | str"
"""Labels as messages, a {key: value} dict, or "k=v,k2=v2" text."""

StateLike: TypeAlias = "int | str | None"

_STATES = {
    "locked": resource_manager_pb2.TICKET_STATE_LOCKED,
    "used": resource_manager_pb2.TICKET_STATE_USED,
    "released": resource_manager_pb2.TICKET_STATE_RELEASED,
    "expired": resource_manager_pb2.TICKET_STATE_EXPIRED,
}

_BACKOFF_INITIAL = 0.05
_BACKOFF_MAX = 2.0


def parse_labels(text: str) -> list[resource_pb2.Label]:
    """Parse "k=v,k2=v2" (each item split at its first '='); ValueError when malformed."""
    out: list[resource_pb2.Label] = []
    text = text.strip()
    if not text:
        return out
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label {item.strip()!r} is not of the form key=value")
        out.append(resource_pb2.Label(key=key.strip(), value=value.strip()))
    return out


def to_labels(labels: LabelsLike) -> list[resource_pb2.Label]:
    """Normalise any accepted labels form to a list of resource_pb2.Label."""
    if isinstance(labels, str):
        return parse_labels(labels)
    if isinstance(labels, Mapping):
        return [resource_pb2.Label(key=str(k), value=str(v)) for k, v in labels.items()]
    out: list[resource_pb2.Label] = []
    for item in labels:
        if not isinstance(item, resource_pb2.Label):
            raise TypeError(f"expected resource_pb2.Label, got {type(item).__name__}")
        out.append(item)
    return out


def labels_text(labels: LabelsLike) -> str:
    """The "k=v,k2=v2" text of labels (the server canonicalises it)."""
    if isinstance(labels, str):
        return labels.strip()
    return ",".join(f"{lb.key}={lb.value}" for lb in to_labels(labels))


def ticket_state(state: StateLike) -> int:
    """A TicketState enum value from an int, "locked"/"LOCKED"/"TICKET_STATE_LOCKED" or None."""
    if state is None:
        return int(resource_manager_pb2.TICKET_STATE_UNSPECIFIED)
    if isinstance(state, int):
        return state
    name = state.strip().lower().removeprefix("ticket_state_")
    if name not in _STATES:
        raise ValueError(f"unknown ticket state {state!r}: expected one of {sorted(_STATES)}")
    return int(_STATES[name])


def _request_id(given: str | None) -> str:
    return given if given else str(uuid.uuid4())


def _is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and getattr(exc, "code", lambda: None)() == (
        grpc.StatusCode.UNAVAILABLE
    )


def _duration(seconds: float) -> Any:
    out = duration_pb2.Duration()
    out.FromNanoseconds(round(seconds * 1e9))
    return out


class _Requests:
    """Request builders shared by the sync and async clients."""

    @staticmethod
    def register_ecm(
        instance: str, total: Any, protected: Any, labels: LabelsLike, request_id: str | None
    ) -> Any:
        return resource_manager_pb2.RegisterEcmRequest(
            request_id=_request_id(request_id),
            instance=instance,
            labels=to_labels(labels),
            total_resource=total,
            protected_resource=protected,
        )

    @staticmethod
    def apply(
        labels: LabelsLike, resource: Any, wait_timeout: float, user: str, request_id: str | None
    ) -> Any:
        if wait_timeout < 0:
            raise ValueError("wait_timeout must not be negative")
        return resource_manager_pb2.ApplyRequest(
            request_id=_request_id(request_id),
            labels=to_labels(labels),
            resource=resource,
            wait_timeout=_duration(wait_timeout) if wait_timeout > 0 else None,
            user=user,
        )

    @staticmethod
    def list_tickets(label: LabelsLike, state: StateLike, page_size: int) -> Any:
        return resource_manager_pb2.ListTicketsRequest(
            page_size=page_size, label=labels_text(label), state=ticket_state(state)
        )


class _Base:
    def __init__(self, target: str, timeout: float, retries: int) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if retries < 0:
            raise ValueError("retries must not be negative")
        self.target = target
        self.timeout = timeout
        self.retries = retries

    def _retry_args(self) -> dict[str, Any]:
        return {
            "retry": retry_if_exception(_is_unavailable),
            "stop": stop_after_attempt(self.retries + 1),
            "wait": wait_random_exponential(multiplier=_BACKOFF_INITIAL, max=_BACKOFF_MAX),
            "reraise": True,
        }


class RMClient(EngineConnCalls, _Base):
    """Blocking client for the labelrm ResourceManagerService, AdminService and
    EngineConnService (plus `execute` on an EngineConn's ExecutorService).

    Mutating calls carry a request id (a fresh uuid4 per call unless given) that is reused
    by their retries; calls are retried only on UNAVAILABLE, with jittered exponential
    backoff. Failures raise `clients.RMError` subclasses.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float = 10.0,
        retries: int = 4,
        channel: grpc.Channel | None = None,
        token: str = "",
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
    ) -> None:
        """Connect to `target` (host:port), or use `channel` (which close() leaves open).

        `token`: a bearer token sent with every call; `tls_ca`: a PEM CA file, turning
        TLS on; `tls_cert` + `tls_key`: a client certificate (see docs/security.md)."""
        super().__init__(target, timeout, retries)
        self._owns_channel = channel is None
        security = ChannelSecurity(tls_ca, tls_cert, tls_key, token)
        self._channel = channel if channel is not None else sync_channel(target, security)
        self._rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(self._channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._ecs = engine_conn_pb2_grpc.EngineConnServiceStub(self._channel)

    def close(self) -> None:
        """Close the channel if this client created it."""
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> RMClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any, timeout: float | None = None) -> Any:
        if hasattr(request, "request_id") and not request.request_id:
            raise AssertionError("mutating calls must carry a request_id to be retried")
        deadline = self.timeout if timeout is None else timeout
        try:
            return Retrying(**self._retry_args())(method, request, timeout=deadline)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    def _pages(self, method: Callable[..., Any], request: Any, field: str) -> Iterator[Any]:
        while True:
            resp = self._call(method, request)
            yield from getattr(resp, field)
            if not resp.next_page_token:
                return
            request.page_token = resp.next_page_token

    # --- ResourceManagerService -------------------------------------------------------------

    def register_ecm(
        self,
        instance: str,
        total: Any,
        protected: Any = None,
        labels: LabelsLike = (),
        request_id: str | None = None,
    ) -> Any:
        """Register (or re-register) an ECM with its total resource; returns the Ecm."""
        req = _Requests.register_ecm(instance, total, protected, labels, request_id)
        return self._call(self._rm.RegisterEcm, req).ecm

    def unregister_ecm(self, instance: str, request_id: str | None = None) -> list[str]:
        """Unregister an ECM; returns the ids of the tickets that were released."""
        req = resource_manager_pb2.UnregisterEcmRequest(
            request_id=_request_id(request_id), instance=instance
        )
        return list(self._call(self._rm.UnregisterEcm, req).released_ticket_ids)

    def apply(
        self,
        labels: LabelsLike,
        resource: Any,
        wait_timeout: float = 0,
        user: str = "",
        request_id: str | None = None,
    ) -> Any:
        """Lock `resource` on every resource-carrying label; returns the LOCKED Ticket.

        With wait_timeout > 0 the server waits up to that many seconds for room.
        """
        req = _Requests.apply(labels, resource, wait_timeout, user, request_id)
        return self._call(self._rm.Apply, req, wait_timeout + self.timeout).ticket

    def report_used(self, ticket_id: str, used: Any = None, request_id: str | None = None) -> Any:
        """Turn a LOCKED ticket into USED (all of it when `used` is None); returns the Ticket."""
        req = resource_manager_pb2.ReportUsedRequest(
            request_id=_request_id(request_id), ticket_id=ticket_id, used_resource=used
        )
        return self._call(self._rm.ReportUsed, req).ticket

    def release(self, ticket_id: str, request_id: str | None = None) -> Any:
        """Release a ticket (idempotent); returns the finished Ticket."""
        req = resource_manager_pb2.ReleaseRequest(
            request_id=_request_id(request_id), ticket_id=ticket_id
        )
        return self._call(self._rm.Release, req).ticket

    def get_ticket(self, ticket_id: str) -> Any:
        """The Ticket with this id (live or finished)."""
        req = resource_manager_pb2.GetTicketRequest(ticket_id=ticket_id)
        return self._call(self._rm.GetTicket, req).ticket

    def list_tickets(
        self, label: LabelsLike = "", state: StateLike = None, page_size: int = 0
    ) -> Iterator[Any]:
        """Every live Ticket (all pages), optionally charged to `label` / in `state`."""
        req = _Requests.list_tickets(label, state, page_size)
        return self._pages(self._rm.ListTickets, req, "tickets")

    def get_label_resource(self, labels: LabelsLike) -> Any:
        """The LabelResource record of one resource-carrying label (or combination)."""
        req = resource_manager_pb2.GetLabelResourceRequest(labels=to_labels(labels))
        return self._call(self._rm.GetLabelResource, req).label_resource

    def list_label_resources(self, source: str = "", page_size: int = 0) -> Iterator[Any]:
        """Every LabelResource (all pages), only "ecm" or "limit" records when `source` is set."""
        req = resource_manager_pb2.ListLabelResourcesRequest(page_size=page_size, source=source)
        return self._pages(self._rm.ListLabelResources, req, "label_resources")

    # --- AdminService -----------------------------------------------------------------------

    def set_label_limit(
        self, labels: LabelsLike, max_resource: Any, request_id: str | None = None
    ) -> Any:
        """Create or replace the limit of a label pattern ("*" allowed); returns the LabelLimit."""
        req = admin_pb2.SetLabelLimitRequest(
            request_id=_request_id(request_id),
            labels=to_labels(labels),
            max_resource=max_resource,
        )
        return self._call(self._admin.SetLabelLimit, req).limit

    def list_label_limits(self, page_size: int = 0) -> Iterator[Any]:
        """Every LabelLimit (all pages)."""
        req = admin_pb2.ListLabelLimitsRequest(page_size=page_size)
        return self._pages(self._admin.ListLabelLimits, req, "limits")

    def delete_label_limit(self, labels: LabelsLike, request_id: str | None = None) -> int:
        """Delete the limit of a label pattern; returns how many label records changed."""
        req = admin_pb2.DeleteLabelLimitRequest(
            request_id=_request_id(request_id), labels=to_labels(labels)
        )
        return int(self._call(self._admin.DeleteLabelLimit, req).affected_labels)

    def put_external_provider(self, provider: Any, request_id: str | None = None) -> Any:
        """Create or replace an external resource provider (an external_pb2.ExternalProvider);
        returns it as stored, without its password."""
        req = admin_pb2.PutExternalProviderRequest(
            request_id=_request_id(request_id), provider=provider
        )
        return self._call(self._admin.PutExternalProvider, req).provider

    def list_external_providers(self) -> list[Any]:
        """Every external resource provider (without passwords)."""
        req = admin_pb2.ListExternalProvidersRequest()
        return list(self._call(self._admin.ListExternalProviders, req).providers)

    def delete_external_provider(self, name: str, request_id: str | None = None) -> Any:
        """Remove a provider; returns it."""
        req = admin_pb2.DeleteExternalProviderRequest(request_id=_request_id(request_id), name=name)
        return self._call(self._admin.DeleteExternalProvider, req).provider

    def test_external_provider(self, name: str) -> Any:
        """Fetch a provider's live figures now: the TestExternalProviderResponse."""
        req = admin_pb2.TestExternalProviderRequest(name=name)
        return self._call(self._admin.TestExternalProvider, req)

    def check_consistency(self) -> Any:
        """Recompute every label's used and locked; returns the CheckConsistencyResponse."""
        return self._call(self._admin.CheckConsistency, admin_pb2.CheckConsistencyRequest())

    def list_events(self, kind: str, object_id: str, user: str = "") -> list[Any]:
        """The state history (StateEvent: time, state, reason) of a "node", an
        "engineconn", a "ticket" or a "demand" (of `user`, if several have that id),
        oldest first."""
        req = admin_pb2.ListEventsRequest(kind=kind, id=object_id, user=user)
        return list(self._call(self._admin.ListEvents, req).events)

    def get_cluster_info(self) -> Any:
        """The RM's version, replicas, database and waiting applies (GetClusterInfoResponse)."""
        return self._call(self._admin.GetClusterInfo, admin_pb2.GetClusterInfoRequest())


class AsyncRMClient(AsyncEngineConnCalls, _Base):
    """grpc.aio client with the same methods as RMClient, as coroutines.

    The list_* methods return async iterators over every page.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float = 10.0,
        retries: int = 4,
        channel: grpc.aio.Channel | None = None,
        token: str = "",
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
    ) -> None:
        """Connect to `target` (host:port), or use `channel` (which close() leaves open).

        `token`: a bearer token sent with every call; `tls_ca`: a PEM CA file, turning
        TLS on; `tls_cert` + `tls_key`: a client certificate (see docs/security.md)."""
        super().__init__(target, timeout, retries)
        self._owns_channel = channel is None
        security = ChannelSecurity(tls_ca, tls_cert, tls_key, token)
        self._channel = channel if channel is not None else aio_channel(target, security)
        self._rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(self._channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._ecs = engine_conn_pb2_grpc.EngineConnServiceStub(self._channel)

    async def close(self) -> None:
        """Close the channel if this client created it."""
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncRMClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(
        self, method: Callable[..., Any], request: Any, deadline: float | None = None
    ) -> Any:
        if hasattr(request, "request_id") and not request.request_id:
            raise AssertionError("mutating calls must carry a request_id to be retried")
        deadline = self.timeout if deadline is None else deadline

        async def attempt() -> Any:
            return await method(request, timeout=deadline)

        try:
            return await AsyncRetrying(**self._retry_args())(attempt)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    async def _pages(
        self, method: Callable[..., Any], request: Any, field: str
    ) -> AsyncIterator[Any]:
        while True:
            resp = await self._call(method, request)
            for item in getattr(resp, field):
                yield item
            if not resp.next_page_token:
                return
            request.page_token = resp.next_page_token

    # --- ResourceManagerService -------------------------------------------------------------

    async def register_ecm(
        self,
        instance: str,
        total: Any,
        protected: Any = None,
        labels: LabelsLike = (),
        request_id: str | None = None,
    ) -> Any:
        """Register (or re-register) an ECM with its total resource; returns the Ecm."""
        req = _Requests.register_ecm(instance, total, protected, labels, request_id)
        return (await self._call(self._rm.RegisterEcm, req)).ecm

    async def unregister_ecm(self, instance: str, request_id: str | None = None) -> list[str]:
        """Unregister an ECM; returns the ids of the tickets that were released."""
        req = resource_manager_pb2.UnregisterEcmRequest(
            request_id=_request_id(request_id), instance=instance
        )
        return list((await self._call(self._rm.UnregisterEcm, req)).released_ticket_ids)

    async def apply(
        self,
        labels: LabelsLike,
        resource: Any,
        wait_timeout: float = 0,
        user: str = "",
        request_id: str | None = None,
    ) -> Any:
        """Lock `resource` on every resource-carrying label; returns the LOCKED Ticket."""
        req = _Requests.apply(labels, resource, wait_timeout, user, request_id)
        return (await self._call(self._rm.Apply, req, wait_timeout + self.timeout)).ticket

    async def report_used(
        self, ticket_id: str, used: Any = None, request_id: str | None = None
    ) -> Any:
        """Turn a LOCKED ticket into USED (all of it when `used` is None); returns the Ticket."""
        req = resource_manager_pb2.ReportUsedRequest(
            request_id=_request_id(request_id), ticket_id=ticket_id, used_resource=used
        )
        return (await self._call(self._rm.ReportUsed, req)).ticket

    async def release(self, ticket_id: str, request_id: str | None = None) -> Any:
        """Release a ticket (idempotent); returns the finished Ticket."""
        req = resource_manager_pb2.ReleaseRequest(
            request_id=_request_id(request_id), ticket_id=ticket_id
        )
        return (await self._call(self._rm.Release, req)).ticket

    async def get_ticket(self, ticket_id: str) -> Any:
        """The Ticket with this id (live or finished)."""
        req = resource_manager_pb2.GetTicketRequest(ticket_id=ticket_id)
        return (await self._call(self._rm.GetTicket, req)).ticket

    def list_tickets(
        self, label: LabelsLike = "", state: StateLike = None, page_size: int = 0
    ) -> AsyncIterator[Any]:
        """Every live Ticket (all pages), optionally charged to `label` / in `state`."""
        req = _Requests.list_tickets(label, state, page_size)
        return self._pages(self._rm.ListTickets, req, "tickets")

    async def get_label_resource(self, labels: LabelsLike) -> Any:
        """The LabelResource record of one resource-carrying label (or combination)."""
        req = resource_manager_pb2.GetLabelResourceRequest(labels=to_labels(labels))
        return (await self._call(self._rm.GetLabelResource, req)).label_resource

    def list_label_resources(self, source: str = "", page_size: int = 0) -> AsyncIterator[Any]:
        """Every LabelResource (all pages), only "ecm" or "limit" records when `source` is set."""
        req = resource_manager_pb2.ListLabelResourcesRequest(page_size=page_size, source=source)
        return self._pages(self._rm.ListLabelResources, req, "label_resources")

    # --- AdminService -----------------------------------------------------------------------

    async def set_label_limit(
        self, labels: LabelsLike, max_resource: Any, request_id: str | None = None
    ) -> Any:
        """Create or replace the limit of a label pattern ("*" allowed); returns the LabelLimit."""
        req = admin_pb2.SetLabelLimitRequest(
            request_id=_request_id(request_id),
            labels=to_labels(labels),
            max_resource=max_resource,
        )
        return (await self._call(self._admin.SetLabelLimit, req)).limit

    def list_label_limits(self, page_size: int = 0) -> AsyncIterator[Any]:
        """Every LabelLimit (all pages)."""
        req = admin_pb2.ListLabelLimitsRequest(page_size=page_size)
        return self._pages(self._admin.ListLabelLimits, req, "limits")

    async def delete_label_limit(self, labels: LabelsLike, request_id: str | None = None) -> int:
        """Delete the limit of a label pattern; returns how many label records changed."""
        req = admin_pb2.DeleteLabelLimitRequest(
            request_id=_request_id(request_id), labels=to_labels(labels)
        )
        return int((await self._call(self._admin.DeleteLabelLimit, req)).affected_labels)

    async def check_consistency(self) -> Any:
        """Recompute every label's used and locked; returns the CheckConsistencyResponse."""
        return await self._call(self._admin.CheckConsistency, admin_pb2.CheckConsistencyRequest())
