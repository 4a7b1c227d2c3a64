"""The core of the SDK's clients: channel, stubs, deadlines, retries and error decoding.

The async modules (labelrm_client/_aio_*.py) are the source; scripts/gen_sync_client.py writes
their blocking twins (labelrm_client/_sync_*.py) from them, so edit the async ones.

Mutating calls carry a request id (a fresh uuid4 per call unless given) that is reused by
their retries; calls are retried only on UNAVAILABLE, with jittered exponential backoff.
Failures raise `labelrm_client.RMError` subclasses, never a raw grpc.RpcError.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import grpc
from labelrm.v1 import (
    admin_pb2_grpc,
    demand_pb2_grpc,
    engine_conn_pb2_grpc,
    resource_manager_pb2_grpc,
    usage_pb2_grpc,
)
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from labelrm_client._channel import ChannelSecurity, aio_channel
from labelrm_client._errors import from_rpc_error
from labelrm_client._requests import DEFAULT_TARGET

_BACKOFF_INITIAL = 0.05
_BACKOFF_MAX = 2.0


def _is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and getattr(exc, "code", lambda: None)() == (
        grpc.StatusCode.UNAVAILABLE
    )


class AsyncClientBase:
    """Channel, stubs and the retried, error-decoding `_call` the client's methods use."""

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

        `timeout`: the deadline (s) of each call; `retries`: how often a call that failed
        with UNAVAILABLE is tried again. `token`: a bearer token sent with every call;
        `tls_ca`: a PEM CA file, turning TLS on; `tls_cert` + `tls_key`: a client
        certificate (see docs/security.md)."""
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if retries < 0:
            raise ValueError("retries must not be negative")
        self.target = target
        self.timeout = timeout
        self.retries = retries
        self._owns_channel = channel is None
        security = ChannelSecurity(tls_ca, tls_cert, tls_key, token)
        self._channel = channel if channel is not None else aio_channel(target, security)
        self._rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(self._channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._ecs = engine_conn_pb2_grpc.EngineConnServiceStub(self._channel)
        self._demands = demand_pb2_grpc.DemandServiceStub(self._channel)
        self._usage = usage_pb2_grpc.UsageServiceStub(self._channel)

    async def close(self) -> None:
        """Close the channel if this client created it."""
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> Self:
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
        """`method(request)` with the client's deadline (or `deadline`), retried on
        UNAVAILABLE; a grpc.RpcError becomes the matching RMError."""
        if hasattr(request, "request_id") and not request.request_id:
            raise AssertionError("mutating calls must carry a request_id to be retried")
        deadline = self.timeout if deadline is None else deadline

        async def attempt() -> Any:
            return await method(request, timeout=deadline)

        retrying = AsyncRetrying(
            retry=retry_if_exception(_is_unavailable),
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_random_exponential(multiplier=_BACKOFF_INITIAL, max=_BACKOFF_MAX),
            reraise=True,
        )
        try:
            return await retrying(attempt)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    async def _pages(self, method: Callable[..., Any], request: Any, field: str) -> list[Any]:
        """Every item in `field` of every page of a List call, fetched now: a failure is
        raised by the call, not later by whoever iterates."""
        items: list[Any] = []
        while True:
            resp = await self._call(method, request)
            items.extend(getattr(resp, field))
            if not resp.next_page_token:
                return items
            request.page_token = resp.next_page_token
