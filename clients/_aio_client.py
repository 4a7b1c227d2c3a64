"""`AsyncRMClient`, the SDK's grpc.aio client, written by hand: scripts/gen_sync_client.py
writes its blocking twin from it."""

from __future__ import annotations

from clients._aio_engineconn import AsyncEngineConnCalls
from clients._aio_rm import AsyncRMCalls

__all__ = ["AsyncRMClient"]


class AsyncRMClient(AsyncRMCalls, AsyncEngineConnCalls):
    """grpc.aio client for the labelrm ResourceManagerService, AdminService,
    EngineConnService and DemandService (plus `execute` on an EngineConn's
    ExecutorService); the same methods as RMClient, as coroutines.

    The list_* methods return lists: every page, fetched by the call, so that a failure
    is raised there; `execute` returns an async iterator.

    Mutating calls carry a request id (a fresh uuid4 per call unless given) that is reused
    by their retries; calls are retried only on UNAVAILABLE, with jittered exponential
    backoff. Failures raise `clients.RMError` subclasses.
    """
