"""EngineConns, ECMs, node lists and demands: EngineConnService, the ECM and node parts of
ResourceManagerService and AdminService, DemandService, and `execute` on an EngineConn's
ExecutorService, as methods of the clients (the async module is the source of the
blocking one: scripts/gen_sync_client.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any

import grpc
from labelrm.v1 import (
    admin_pb2,
    demand_pb2,
    engine_conn_pb2,
    executor_pb2,
    executor_pb2_grpc,
    resource_manager_pb2,
)

from labelrm_client import _engineconn as ecb
from labelrm_client import _requests as rq
from labelrm_client._aio_base import AsyncClientBase
from labelrm_client._engineconn import AskResult, ExecItem, exec_item
from labelrm_client._errors import from_rpc_error
from labelrm_client._requests import LabelsLike, StateLike


class AsyncEngineConnCalls(AsyncClientBase):
    """EngineConn, ECM, node-list, demand and `execute` methods."""

    # --- EngineConnService ----------------------------------------------------------------------

    async def create_engine_conn(
        self,
        labels: LabelsLike,
        user: str = "",
        params: Mapping[str, Any] | None = None,
        # Sent to the server (how long it waits for ready), not a client-side timeout.
        timeout: float = 60,  # noqa: ASYNC109
        request_id: str | None = None,
        memory: int | str | None = None,
        cpu: int | str | None = None,
    ) -> engine_conn_pb2.EngineConn:
        """Start an EngineConn and wait (up to `timeout` s) until it is ready.

        `labels` must hold userCreator and engineType; `user` defaults to the userCreator's
        user. `memory` (bytes, or "512Mi") and `cpu` (millicores, or "500m", "2") are what
        it asks for (default: the engine's defaults); its agent holds it to what is granted.
        Returns the ready EngineConn (IDLE, with its executor `address`); a launch that
        failed on every ECM tried raises FailedPrecondition (reason LAUNCH_FAILED).
        """
        req = ecb.create(labels, user, ecb.sized(params, memory, cpu), timeout, request_id)
        resp = await self._call(self._ecs.CreateEngineConn, req, timeout + self.timeout)
        return resp.engine_conn

    async def ask_engine_conn(
        self,
        labels: LabelsLike,
        user: str = "",
        params: Mapping[str, Any] | None = None,
        timeout: float = 60,  # noqa: ASYNC109 - sent to the server, as in create
        hold: float | None = None,
        request_id: str | None = None,
        memory: int | str | None = None,
        cpu: int | str | None = None,
    ) -> AskResult:
        """An idle EngineConn of the same user and labels, held for this caller for `hold`
        s (server default when None), or a new one (of `memory` and `cpu`, as in
        `create_engine_conn`); returns (EngineConn, reused)."""
        req = ecb.ask(labels, user, ecb.sized(params, memory, cpu), timeout, hold, request_id)
        resp = await self._call(self._ecs.AskEngineConn, req, timeout + self.timeout)
        return AskResult(resp.engine_conn, bool(resp.reused))

    async def get_engine_conn(self, ec_id: str) -> engine_conn_pb2.EngineConn:
        """The EngineConn with this id, live or ended, with its ranked ECM choices."""
        req = engine_conn_pb2.GetEngineConnRequest(engine_conn_id=ec_id)
        return (await self._call(self._ecs.GetEngineConn, req)).engine_conn

    async def list_engine_conns(
        self, user: str = "", state: int | str | None = None, ecm: str = "", page_size: int = 0
    ) -> list[engine_conn_pb2.EngineConn]:
        """Every EngineConn (all pages, fetched by the call; live and ended), optionally of
        one user, in one state, or on one ECM."""
        req = ecb.list_engine_conns(user, state, ecm, page_size)
        return await self._pages(self._ecs.ListEngineConns, req, "engine_conns")

    async def kill_engine_conn(
        self, ec_id: str, reason: str = "", request_id: str | None = None
    ) -> engine_conn_pb2.EngineConn:
        """Order an EngineConn stopped; returns it as it is then (usually SHUTTING_DOWN).
        Its resource is released once its agent reports the exit."""
        req = ecb.kill(ec_id, reason, request_id)
        return (await self._call(self._ecs.KillEngineConn, req)).engine_conn

    # --- ECMs and node lists --------------------------------------------------------------------

    async def get_ecm(self, instance: str) -> resource_manager_pb2.Ecm:
        """The Ecm (state, last heartbeat, live EngineConns, left resource)."""
        req = ecb.get_ecm(instance)
        return (await self._call(self._rm.GetEcm, req)).ecm

    async def list_ecms(self, page_size: int = 0) -> list[resource_manager_pb2.Ecm]:
        """Every registered Ecm (all pages, fetched by the call)."""
        req = resource_manager_pb2.ListEcmsRequest(page_size=page_size)
        return await self._pages(self._rm.ListEcms, req, "ecms")

    async def refresh_nodes(
        self,
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
        request_id: str | None = None,
    ) -> list[str]:
        """Replace the include and exclude lists (hosts or host:port; empty include = all);
        returns the registered ECMs that are no longer allowed."""
        req = rq.refresh_nodes(include, exclude, request_id)
        return list((await self._call(self._admin.RefreshNodes, req)).disallowed_instances)

    async def decommission_ecm(self, instance: str, request_id: str | None = None) -> int:
        """Decommission an ECM (no new EngineConns; it leaves once its own end); returns how
        many EngineConns it still runs."""
        req = ecb.decommission(instance, request_id)
        return int((await self._call(self._admin.DecommissionEcm, req)).live_engine_conns)

    async def cordon_ecm(
        self, instance: str, reason: str = "", request_id: str | None = None
    ) -> resource_manager_pb2.Ecm:
        """Cordon an ECM: no new work there (no EngineConn starts, no Apply takes its
        label), what runs goes on; `reason` goes into its history. Returns the Ecm."""
        req = admin_pb2.CordonEcmRequest(
            request_id=rq.request_id(request_id), instance=instance, reason=reason
        )
        return (await self._call(self._admin.CordonEcm, req)).ecm

    async def uncordon_ecm(
        self, instance: str, request_id: str | None = None
    ) -> resource_manager_pb2.Ecm:
        """Let a cordoned ECM take new work again (a decommission in progress is called
        off too); returns the Ecm."""
        req = admin_pb2.UncordonEcmRequest(request_id=rq.request_id(request_id), instance=instance)
        return (await self._call(self._admin.UncordonEcm, req)).ecm

    # --- DemandService --------------------------------------------------------------------------

    async def submit_demand(
        self, demand_id: str, labels: LabelsLike, resource: Any, when: str = "", user: str = ""
    ) -> demand_pb2.SubmitDemandResponse:
        """Submit a time-aware demand (docs/demands.md) for `resource` on `labels`, with
        the time conditions `when` in the paper's syntax (server defaults when blank).
        The client-chosen `demand_id` makes it idempotent: the response's `demand` and
        whether this call `created` it."""
        req = rq.submit_demand(demand_id, labels, resource, when, user)
        return await self._call(self._demands.SubmitDemand, req)

    async def get_demand(self, demand_id: str, user: str = "") -> demand_pb2.Demand:
        """The Demand with this id (of `user`, for an admin) with its transitions."""
        req = demand_pb2.GetDemandRequest(demand_id=demand_id, user=user)
        return (await self._call(self._demands.GetDemand, req)).demand

    async def list_demands(
        self, state: StateLike = None, user: str = "", page_size: int = 0
    ) -> list[demand_pb2.Demand]:
        """Every Demand (all pages, fetched by the call), optionally in one state
        ("allocated", ...) or of one user."""
        req = demand_pb2.ListDemandsRequest(
            page_size=page_size, state=rq.demand_state(state), user=user
        )
        return await self._pages(self._demands.ListDemands, req, "demands")

    async def cancel_demand(
        self, demand_id: str, reason: str = "", user: str = "", request_id: str | None = None
    ) -> demand_pb2.Demand:
        """Cancel a demand (it becomes FAILED, `reason` in its history); returns it."""
        req = rq.cancel_demand(demand_id, reason, user, request_id)
        return (await self._call(self._demands.CancelDemand, req)).demand

    async def claim_demand(
        self, demand_id: str, user: str = "", request_id: str | None = None
    ) -> demand_pb2.ClaimDemandResponse:
        """Claim an ALLOCATED demand (it moves to MONITORING): the response's `demand` and
        its `ticket`."""
        req = rq.claim_demand(demand_id, user, request_id)
        return await self._call(self._demands.ClaimDemand, req)

    # --- ExecutorService ------------------------------------------------------------------------

    def execute(
        self,
        address: Any,
        code: str,
        timeout: float | None = None,
        execution_id: str | None = None,
        secret: str | None = None,
    ) -> AsyncGenerator[ExecItem, None]:
        """Run `code` in an EngineConn: `address` is the EngineConn as Create / Ask / Get
        returned it (its address and secret are used), or its executor address as a string
        with its `secret` (the EngineConn's `secret` field) given separately.

        Yields ExecOutput(stream, text) pieces as they come, then one ExecResult. Closing
        the iterator early (break, Ctrl-C) cancels the execution. `timeout` (s) makes the
        engine stop the code; None means no limit. A missing or wrong secret raises
        Unauthenticated (an EngineConn from a list carries none: get it first).
        """
        target, metadata = ecb.executor_target(address, secret)
        req = ecb.execute(code, timeout, execution_id)
        return _execute(target, metadata, req, ecb.exec_deadline(timeout, self.timeout))

    async def cancel_execution(
        self, address: Any, execution_id: str = "", secret: str | None = None
    ) -> bool:
        """Stop the execution `execution_id` (whatever runs, when empty) in an EngineConn
        (`address` and `secret` as in `execute`); True when one was running and was told
        to stop: its `execute` stream then ends with an ExecResult with `cancelled` set.
        The shell engine stops the code's processes (TERM, then KILL); the python engine
        interrupts the code (KeyboardInterrupt) at its next Python instruction."""
        target, metadata = ecb.executor_target(address, secret)
        req = executor_pb2.CancelRequest(execution_id=execution_id)
        return await _cancel(target, metadata, req, self.timeout)


async def _execute(
    address: str,
    metadata: tuple[tuple[str, str], ...],
    request: executor_pb2.ExecuteRequest,
    deadline: float | None,
) -> AsyncGenerator[ExecItem, None]:
    # Never retried: running code twice is not safe, and ExecutorService has no request ids.
    async with grpc.aio.insecure_channel(address) as channel:
        call = executor_pb2_grpc.ExecutorServiceStub(channel).Execute(
            request, timeout=deadline, metadata=metadata
        )
        try:
            async for event in call:
                yield exec_item(event)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        finally:
            call.cancel()  # no-op once finished; otherwise the engine stops the code


async def _cancel(
    address: str,
    metadata: tuple[tuple[str, str], ...],
    request: executor_pb2.CancelRequest,
    deadline: float,
) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        try:
            resp = await stub.Cancel(request, timeout=deadline, metadata=metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        return bool(resp.cancelled)
