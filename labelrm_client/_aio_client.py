"""The SDK's client class, `AsyncRMClient`, on grpc.aio (the async modules are the source:
scripts/gen_sync_client.py writes the blocking twins, labelrm_client/_sync_*.py, from them)."""

from __future__ import annotations

from labelrm_client._aio_engineconn import AsyncEngineConnCalls
from labelrm_client._aio_rm import AsyncRMCalls

__all__ = ["AsyncRMClient"]


class AsyncRMClient(AsyncRMCalls, AsyncEngineConnCalls):
    """Client for the labelrm ResourceManagerService, AdminService,
    EngineConnService and DemandService (plus `execute` on an EngineConn's
    ExecutorService) on grpc.aio: its methods are coroutines.

    The list_* methods return lists: every page, fetched by the call, so that a failure
    is raised there; `execute` returns an async iterator.

    Mutating calls carry a request id (a fresh uuid4 per call unless given) that is reused
    by their retries; calls are retried only on UNAVAILABLE, with jittered exponential
    backoff. Failures raise `labelrm_client.RMError` subclasses.
    """
