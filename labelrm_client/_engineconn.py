"""EngineConn state names, `execute` results and the EngineConn request builders of the SDK.

The calls themselves are methods of `AsyncRMClient` (labelrm_client/_aio_engineconn.py) and of its
generated blocking twin `RMClient`.

Retries follow the rest of the SDK: only on UNAVAILABLE, and a mutating call only because
it carries a request_id the server deduplicates (CreateEngineConn / AskEngineConn claim
it; kill, refresh and decommission are idempotent anyway). `execute` is never retried:
running code twice is not safe, and ExecutorService has no request ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, TypeAlias

from labelrm.v1 import admin_pb2, engine_conn_pb2, executor_pb2, resource_manager_pb2

from labelrm_client._requests import LabelsLike, request_id, to_labels
from labelrm_common.durations import duration
from labelrm_common.quantity import parse_cpu, parse_memory

__all__ = [
    "ECM_STATES",
    "EC_STATES",
    "AskResult",
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


class AskResult(NamedTuple):
    """What `ask_engine_conn` returns: the EngineConn and whether it was reused."""

    engine_conn: engine_conn_pb2.EngineConn
    reused: bool


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


def exec_item(event: Any) -> ExecItem:
    """An ExecuteResponse as ExecOutput or ExecResult."""
    if event.HasField("output"):
        return ExecOutput(_STREAMS.get(event.output.stream, "stdout"), event.output.text)
    r = event.result
    return ExecResult(int(r.exit_code), bool(r.cancelled), str(r.error))


# --- request builders -------------------------------------------------------------------------


def sized(
    params: Mapping[str, Any] | None, memory: int | str | None, cpu: int | str | None
) -> dict[str, Any]:
    """`params` with the engine params memory_bytes and cpu_millis set from `memory`
    (bytes, or a quantity: "512Mi", "2Gi") and `cpu` (millicores, or "500m", "2");
    ValueError for a bad quantity or one given twice."""
    out = dict(params or {})
    for name, value, parse in (
        ("memory_bytes", memory, parse_memory),
        ("cpu_millis", cpu, parse_cpu),
    ):
        if value is None:
            continue
        if name in out:
            raise ValueError(f"{name} given both as a param and as {name.split('_')[0]}")
        out[name] = parse(value) if isinstance(value, str) else int(value)
    return out


def create(
    labels: LabelsLike,
    user: str,
    params: Mapping[str, Any] | None,
    timeout: float,
    rid: str | None,
) -> engine_conn_pb2.CreateEngineConnRequest:
    """CreateEngineConnRequest; ValueError unless timeout > 0."""
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    return engine_conn_pb2.CreateEngineConnRequest(
        request_id=request_id(rid),
        user=user,
        labels=to_labels(labels),
        params={str(k): str(v) for k, v in (params or {}).items()},
        timeout=duration(timeout),
    )


def ask(
    labels: LabelsLike,
    user: str,
    params: Mapping[str, Any] | None,
    timeout: float,
    hold: float | None,
    rid: str | None,
) -> engine_conn_pb2.AskEngineConnRequest:
    """AskEngineConnRequest; ValueError unless timeout > 0 and hold (when given) > 0."""
    base = create(labels, user, params, timeout, rid)
    if hold is not None and hold <= 0:
        raise ValueError("hold must be positive")
    return engine_conn_pb2.AskEngineConnRequest(
        request_id=base.request_id,
        user=base.user,
        labels=base.labels,
        params=base.params,
        timeout=base.timeout,
        hold=duration(hold) if hold is not None else None,
    )


def list_engine_conns(
    user: str, state: int | str | None, ecm: str, page_size: int
) -> engine_conn_pb2.ListEngineConnsRequest:
    """ListEngineConnsRequest (first page)."""
    return engine_conn_pb2.ListEngineConnsRequest(
        page_size=page_size, user=user, state=ec_state(state), ecm_instance=ecm
    )


def kill(ec_id: str, reason: str, rid: str | None) -> engine_conn_pb2.KillEngineConnRequest:
    """KillEngineConnRequest."""
    return engine_conn_pb2.KillEngineConnRequest(
        request_id=request_id(rid), engine_conn_id=ec_id, reason=reason
    )


def decommission(instance: str, rid: str | None) -> admin_pb2.DecommissionEcmRequest:
    """DecommissionEcmRequest."""
    return admin_pb2.DecommissionEcmRequest(request_id=request_id(rid), instance=instance)


def get_ecm(instance: str) -> resource_manager_pb2.GetEcmRequest:
    """GetEcmRequest."""
    return resource_manager_pb2.GetEcmRequest(instance=instance)


def execute(
    code: str, timeout: float | None, execution_id: str | None
) -> executor_pb2.ExecuteRequest:
    """ExecuteRequest; ValueError unless timeout is None (no limit) or > 0."""
    if timeout is not None and timeout <= 0:
        raise ValueError("timeout must be positive (None: no limit)")
    return executor_pb2.ExecuteRequest(
        execution_id=request_id(execution_id),
        code=code,
        timeout=duration(timeout) if timeout is not None else None,
    )


def exec_deadline(timeout: float | None, margin: float) -> float | None:
    """The deadline of an Execute call: the engine stops the code at `timeout`; the call
    gets `margin` more for the result. Without a timeout the call has no deadline: how long
    code runs is the caller's business, and closing the iterator (Ctrl-C) cancels it."""
    return None if timeout is None else timeout + margin


def executor_target(address: Any, secret: str | None) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(host:port, call metadata) for an EngineConn message or an address plus secret."""
    if not isinstance(address, str):
        secret = address.secret if secret is None else secret
        address = address.address
    if not address:
        raise ValueError("the EngineConn has no executor address (not ready, or ended)")
    # The executor is plaintext on the EngineConn's host: the secret, not the channel, is
    # what keeps other local users out.
    return address, ((("authorization", f"Bearer {secret}"),) if secret else ())
