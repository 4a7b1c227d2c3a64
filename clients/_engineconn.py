"""EngineConn, ECM and node-list calls of the SDK, and `execute` on an EngineConn.

The methods live in two mixins, `EngineConnCalls` (blocking) and `AsyncEngineConnCalls`
(grpc.aio), that `RMClient` and `AsyncRMClient` inherit: they share the client's
channel, deadline, retry policy and error decoding. The split keeps `_impl.py` about
tickets and limits.

Retries follow the rest of the SDK: only on UNAVAILABLE, and a mutating call only because
it carries a request_id the server deduplicates (CreateEngineConn / AskEngineConn claim
it; kill, refresh and decommission are idempotent anyway). `execute` is never retried:
running code twice is not safe, and ExecutorService has no request ids.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import grpc
from google.protobuf import duration_pb2
from labelrm.v1 import (
    admin_pb2,
    engine_conn_pb2,
    executor_pb2,
    executor_pb2_grpc,
    resource_manager_pb2,
)

from clients._errors import from_rpc_error

if TYPE_CHECKING:
    from clients._impl import LabelsLike

__all__ = [
    "ECM_STATES",
    "EC_STATES",
    "AsyncEngineConnCalls",
    "EngineConnCalls",
    "ExecItem",
    "ExecOutput",
    "ExecResult",
    "ec_state",
    "ec_state_name",
    "ecm_state_name",
]

EC_STATES: dict[str, int] = {
    name.removeprefix("ENGINE_CONN_STATE_").lower(): int(value)
    for name, value in engine_conn_pb2.EngineConnState.items()
    if value != engine_conn_pb2.ENGINE_CONN_STATE_UNSPECIFIED
}
"""EngineConn state names as rmctl and the SDK accept them ("idle", "shutting_down", ...)."""

ECM_STATES: dict[str, int] = {
    name.removeprefix("ECM_STATE_").lower(): int(value)
    for name, value in resource_manager_pb2.EcmState.items()
    if value != resource_manager_pb2.ECM_STATE_UNSPECIFIED
}

LIVE_EC_STATES = frozenset(
    EC_STATES[name] for name in ("starting", "idle", "busy", "shutting_down")
)
"""States in which an EngineConn still has (or is about to have) a process."""


def ec_state(state: int | str | None) -> int:
    """An EngineConnState value from an int, "idle" / "IDLE" / "ENGINE_CONN_STATE_IDLE" or
    None (unspecified: no filter)."""
    if state is None:
        return int(engine_conn_pb2.ENGINE_CONN_STATE_UNSPECIFIED)
    if isinstance(state, int):
        return state
    name = state.strip().lower().removeprefix("engine_conn_state_")
    if name not in EC_STATES:
        raise ValueError(f"unknown EngineConn state {state!r}: expected one of {sorted(EC_STATES)}")
    return EC_STATES[name]


def ec_state_name(value: int) -> str:
    """ "IDLE" for ENGINE_CONN_STATE_IDLE; "-" when unspecified."""
    for name, known in EC_STATES.items():
        if known == value:
            return name.upper()
    return "-" if value == 0 else str(value)


def ecm_state_name(value: int) -> str:
    """ "RUNNING" for ECM_STATE_RUNNING; "-" when unspecified."""
    for name, known in ECM_STATES.items():
        if known == value:
            return name.upper()
    return "-" if value == 0 else str(value)


class ExecOutput(NamedTuple):
    """A piece of an execution's output: `stream` is "stdout" or "stderr"."""

    stream: str
    text: str


class ExecResult(NamedTuple):
    """How an execution ended (the last item `execute` yields)."""

    exit_code: int
    cancelled: bool
    error: str  # the python engine's traceback, "timed out", ...


ExecItem: TypeAlias = "ExecOutput | ExecResult"

_STREAMS = {
    executor_pb2.OUTPUT_STREAM_STDOUT: "stdout",
    executor_pb2.OUTPUT_STREAM_STDERR: "stderr",
}


def _exec_item(event: Any) -> ExecItem:
    if event.HasField("output"):
        return ExecOutput(_STREAMS.get(event.output.stream, "stdout"), event.output.text)
    r = event.result
    return ExecResult(int(r.exit_code), bool(r.cancelled), str(r.error))


def _duration(seconds: float) -> Any:
    out = duration_pb2.Duration()
    out.FromNanoseconds(round(seconds * 1e9))
    return out


def _rid(given: str | None) -> str:
    """The caller's request id, or a fresh one that the call's retries reuse."""
    return given if given else str(uuid.uuid4())


class _EcRequests:
    """Request builders shared by the sync and async mixins."""

    @staticmethod
    def create(
        labels: LabelsLike,
        user: str,
        params: Mapping[str, Any] | None,
        timeout: float,
        request_id: str | None,
    ) -> Any:
        # Imported here: _impl imports this module for its mixins.
        from clients._impl import to_labels

        if timeout <= 0:
            raise ValueError("timeout must be positive")
        return engine_conn_pb2.CreateEngineConnRequest(
            request_id=_rid(request_id),
            user=user,
            labels=to_labels(labels),
            params={str(k): str(v) for k, v in (params or {}).items()},
            timeout=_duration(timeout),
        )

    @staticmethod
    def ask(
        labels: LabelsLike,
        user: str,
        params: Mapping[str, Any] | None,
        timeout: float,
        hold: float | None,
        request_id: str | None,
    ) -> Any:
        base = _EcRequests.create(labels, user, params, timeout, request_id)
        if hold is not None and hold <= 0:
            raise ValueError("hold must be positive")
        return engine_conn_pb2.AskEngineConnRequest(
            request_id=base.request_id,
            user=base.user,
            labels=base.labels,
            params=base.params,
            timeout=base.timeout,
            hold=_duration(hold) if hold is not None else None,
        )

    @staticmethod
    def list(user: str, state: int | str | None, ecm: str, page_size: int) -> Any:
        return engine_conn_pb2.ListEngineConnsRequest(
            page_size=page_size, user=user, state=ec_state(state), ecm_instance=ecm
        )

    @staticmethod
    def kill(ec_id: str, reason: str, request_id: str | None) -> Any:
        return engine_conn_pb2.KillEngineConnRequest(
            request_id=_rid(request_id), engine_conn_id=ec_id, reason=reason
        )

    @staticmethod
    def refresh(include: Iterable[str], exclude: Iterable[str], request_id: str | None) -> Any:
        return admin_pb2.RefreshNodesRequest(
            request_id=_rid(request_id), include=list(include), exclude=list(exclude)
        )

    @staticmethod
    def execute(code: str, timeout: float | None, execution_id: str | None) -> Any:
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be positive (None: no limit)")
        return executor_pb2.ExecuteRequest(
            execution_id=_rid(execution_id),
            code=code,
            timeout=_duration(timeout) if timeout is not None else None,
        )


def _exec_deadline(timeout: float | None, margin: float) -> float | None:
    # The engine stops the code at `timeout`; the call gets `margin` more for the result.
    # Without a timeout the call has no deadline: how long code runs is the caller's
    # business, and closing the iterator (Ctrl-C) cancels it.
    return None if timeout is None else timeout + margin


class EngineConnCalls:
    """EngineConnService, ECM and node-list methods of `RMClient`."""

    timeout: float
    _ecs: Any
    _rm: Any
    _admin: Any

    if TYPE_CHECKING:

        def _call(
            self, method: Callable[..., Any], request: Any, timeout: float | None = None
        ) -> Any: ...

        def _pages(self, method: Callable[..., Any], request: Any, field: str) -> Iterator[Any]: ...

    # --- EngineConnService ------------------------------------------------------------------

    def create_engine_conn(
        self,
        labels: LabelsLike,
        user: str = "",
        params: Mapping[str, Any] | None = None,
        timeout: float = 60,
        request_id: str | None = None,
    ) -> Any:
        """Start an EngineConn and wait (up to `timeout` s) until it is ready.

        `labels` must hold userCreator and engineType; `user` defaults to the userCreator's
        user. Returns the ready EngineConn (IDLE, with its executor `address`); a launch
        that failed on every ECM tried raises FailedPrecondition (reason LAUNCH_FAILED).
        """
        req = _EcRequests.create(labels, user, params, timeout, request_id)
        return self._call(self._ecs.CreateEngineConn, req, timeout + self.timeout).engine_conn

    def ask_engine_conn(
        self,
        labels: LabelsLike,
        user: str = "",
        params: Mapping[str, Any] | None = None,
        timeout: float = 60,
        hold: float | None = None,
        request_id: str | None = None,
    ) -> tuple[Any, bool]:
        """An idle EngineConn of the same user and labels, held for this caller for `hold`
        s (server default when None), or a new one; returns (EngineConn, reused)."""
        req = _EcRequests.ask(labels, user, params, timeout, hold, request_id)
        resp = self._call(self._ecs.AskEngineConn, req, timeout + self.timeout)
        return resp.engine_conn, bool(resp.reused)

    def get_engine_conn(self, ec_id: str) -> Any:
        """The EngineConn with this id, live or ended, with its ranked ECM choices."""
        req = engine_conn_pb2.GetEngineConnRequest(engine_conn_id=ec_id)
        return self._call(self._ecs.GetEngineConn, req).engine_conn

    def list_engine_conns(
        self, user: str = "", state: int | str | None = None, ecm: str = "", page_size: int = 0
    ) -> Iterator[Any]:
        """Every EngineConn (all pages, live and ended), optionally of one user, in one
        state, or on one ECM."""
        req = _EcRequests.list(user, state, ecm, page_size)
        return self._pages(self._ecs.ListEngineConns, req, "engine_conns")

    def kill_engine_conn(self, ec_id: str, reason: str = "", request_id: str | None = None) -> Any:
        """Order an EngineConn stopped; returns it as it is then (usually SHUTTING_DOWN).
        Its resource is released once its agent reports the exit."""
        req = _EcRequests.kill(ec_id, reason, request_id)
        return self._call(self._ecs.KillEngineConn, req).engine_conn

    # --- ECMs and node lists ----------------------------------------------------------------

    def get_ecm(self, instance: str) -> Any:
        """The Ecm (state, last heartbeat, live EngineConns, left resource)."""
        req = resource_manager_pb2.GetEcmRequest(instance=instance)
        return self._call(self._rm.GetEcm, req).ecm

    def list_ecms(self, page_size: int = 0) -> Iterator[Any]:
        """Every registered Ecm (all pages)."""
        req = resource_manager_pb2.ListEcmsRequest(page_size=page_size)
        return self._pages(self._rm.ListEcms, req, "ecms")

    def refresh_nodes(
        self,
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
        request_id: str | None = None,
    ) -> list[str]:
        """Replace the include and exclude lists (hosts or host:port; empty include = all);
        returns the registered ECMs that are no longer allowed."""
        req = _EcRequests.refresh(include, exclude, request_id)
        return list(self._call(self._admin.RefreshNodes, req).disallowed_instances)

    def decommission_ecm(self, instance: str, request_id: str | None = None) -> int:
        """Drain an ECM (no new EngineConns; it leaves once its own end); returns how many
        EngineConns it still runs."""
        req = admin_pb2.DecommissionEcmRequest(request_id=_rid(request_id), instance=instance)
        return int(self._call(self._admin.DecommissionEcm, req).live_engine_conns)

    # --- ExecutorService --------------------------------------------------------------------

    def execute(
        self,
        address: Any,
        code: str,
        timeout: float | None = None,
        execution_id: str | None = None,
        secret: str | None = None,
    ) -> Generator[ExecItem, None, None]:
        """Run `code` in an EngineConn: `address` is the EngineConn as Create / Ask / Get
        returned it (its address and secret are used), or its executor address as a string
        with its `secret` (the EngineConn's `secret` field) given separately.

        Yields ExecOutput(stream, text) pieces as they come, then one ExecResult. Closing
        the iterator early (break, Ctrl-C) cancels the execution. `timeout` (s) makes the
        engine stop the code; None means no limit. A missing or wrong secret raises
        Unauthenticated (an EngineConn from a list carries none: get it first).
        """
        target, metadata = _executor_target(address, secret)
        req = _EcRequests.execute(code, timeout, execution_id)
        return _execute(target, metadata, req, _exec_deadline(timeout, self.timeout))


def _executor_target(address: Any, secret: str | None) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(host:port, call metadata) for an EngineConn message or an address plus secret."""
    if not isinstance(address, str):
        secret = address.secret if secret is None else secret
        address = address.address
    if not address:
        raise ValueError("the EngineConn has no executor address (not ready, or ended)")
    # The executor is plaintext on the EngineConn's host: the secret, not the channel, is
    # what keeps other local users out.
    return address, ((("authorization", f"Bearer {secret}"),) if secret else ())


def _execute(
    address: str, metadata: tuple[tuple[str, str], ...], request: Any, deadline: float | None
) -> Generator[ExecItem, None, None]:
    channel = grpc.insecure_channel(address)
    try:
        stream = executor_pb2_grpc.ExecutorServiceStub(channel).Execute(
            request, timeout=deadline, metadata=metadata
        )
        try:
            for event in stream:
                yield _exec_item(event)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        finally:
            stream.cancel()  # no-op once finished; otherwise the engine stops the code
    finally:
        channel.close()


class AsyncEngineConnCalls:
    """The methods of `EngineConnCalls`, as coroutines, for `AsyncRMClient`."""

    timeout: float
    _ecs: Any
    _rm: Any
    _admin: Any

    if TYPE_CHECKING:

        async def _call(
            self, method: Callable[..., Any], request: Any, deadline: float | None = None
        ) -> Any: ...

        def _pages(
            self, method: Callable[..., Any], request: Any, field: str
        ) -> AsyncIterator[Any]: ...

    async def create_engine_conn(
        self,
        labels: LabelsLike,
        user: str = "",
        params: Mapping[str, Any] | None = None,
        # Sent to the server (how long it waits for ready), not a client-side timeout.
        timeout: float = 60,  # noqa: ASYNC109
        request_id: str | None = None,
    ) -> Any:
        """Start an EngineConn and wait (up to `timeout` s) until it is ready."""
        req = _EcRequests.create(labels, user, params, timeout, request_id)
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
    ) -> tuple[Any, bool]:
        """An idle EngineConn of the same user and labels, or a new one: (EngineConn, reused)."""
        req = _EcRequests.ask(labels, user, params, timeout, hold, request_id)
        resp = await self._call(self._ecs.AskEngineConn, req, timeout + self.timeout)
        return resp.engine_conn, bool(resp.reused)

    async def get_engine_conn(self, ec_id: str) -> Any:
        """The EngineConn with this id, live or ended, with its ranked ECM choices."""
        req = engine_conn_pb2.GetEngineConnRequest(engine_conn_id=ec_id)
        return (await self._call(self._ecs.GetEngineConn, req)).engine_conn

    def list_engine_conns(
        self, user: str = "", state: int | str | None = None, ecm: str = "", page_size: int = 0
    ) -> AsyncIterator[Any]:
        """Every EngineConn (all pages), optionally of one user, in one state, on one ECM."""
        req = _EcRequests.list(user, state, ecm, page_size)
        return self._pages(self._ecs.ListEngineConns, req, "engine_conns")

    async def kill_engine_conn(
        self, ec_id: str, reason: str = "", request_id: str | None = None
    ) -> Any:
        """Order an EngineConn stopped; returns it as it is then."""
        req = _EcRequests.kill(ec_id, reason, request_id)
        return (await self._call(self._ecs.KillEngineConn, req)).engine_conn

    async def get_ecm(self, instance: str) -> Any:
        """The Ecm with its state."""
        req = resource_manager_pb2.GetEcmRequest(instance=instance)
        return (await self._call(self._rm.GetEcm, req)).ecm

    def list_ecms(self, page_size: int = 0) -> AsyncIterator[Any]:
        """Every registered Ecm (all pages)."""
        req = resource_manager_pb2.ListEcmsRequest(page_size=page_size)
        return self._pages(self._rm.ListEcms, req, "ecms")

    async def refresh_nodes(
        self,
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
        request_id: str | None = None,
    ) -> list[str]:
        """Replace the include and exclude lists; returns the ECMs no longer allowed."""
        req = _EcRequests.refresh(include, exclude, request_id)
        return list((await self._call(self._admin.RefreshNodes, req)).disallowed_instances)

    async def decommission_ecm(self, instance: str, request_id: str | None = None) -> int:
        """Drain an ECM; returns how many EngineConns it still runs."""
        req = admin_pb2.DecommissionEcmRequest(request_id=_rid(request_id), instance=instance)
        return int((await self._call(self._admin.DecommissionEcm, req)).live_engine_conns)

    def execute(
        self,
        address: Any,
        code: str,
        timeout: float | None = None,
        execution_id: str | None = None,
        secret: str | None = None,
    ) -> AsyncIterator[ExecItem]:
        """Run `code` in an EngineConn (the message, or its address plus `secret`):
        ExecOutput pieces, then one ExecResult (see `RMClient.execute`)."""
        target, metadata = _executor_target(address, secret)
        req = _EcRequests.execute(code, timeout, execution_id)
        return _execute_async(target, metadata, req, _exec_deadline(timeout, self.timeout))


async def _execute_async(
    address: str, metadata: tuple[tuple[str, str], ...], request: Any, deadline: float | None
) -> AsyncIterator[ExecItem]:
    async with grpc.aio.insecure_channel(address) as channel:
        call = executor_pb2_grpc.ExecutorServiceStub(channel).Execute(
            request, timeout=deadline, metadata=metadata
        )
        try:
            async for event in call:
                yield _exec_item(event)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        finally:
            call.cancel()
