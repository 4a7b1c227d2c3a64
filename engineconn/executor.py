"""The ExecutorService of an EngineConn: runs the user's code in its engine, one
execution at a time, and streams the output back.

Concurrency rule: an EngineConn runs ONE execution at a time. A second Execute while
one runs is refused with FAILED_PRECONDITION rather than queued: the RM hands an idle
EngineConn to one caller, so a concurrent call is a client bug, and a refusal is
visible at once where a queue would hide it behind a silent wait.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import grpc
from labelrm.v1 import executor_pb2

log = logging.getLogger(__name__)

STDOUT: Final = "stdout"
STDERR: Final = "stderr"
_PB_STREAM = {
    STDOUT: executor_pb2.OUTPUT_STREAM_STDOUT,
    STDERR: executor_pb2.OUTPUT_STREAM_STDERR,
}
# A queue this long makes the engine wait for the client (backpressure) instead of
# buffering a runaway `yes` in memory.
_MAX_PENDING_EVENTS = 256
# Consecutive chunks of one stream are merged up to this size before being sent.
_MAX_CHUNK_CHARS = 64 * 1024


@dataclass(frozen=True)
class Output:
    """A piece of output of an execution."""

    stream: str
    text: str


@dataclass(frozen=True)
class Outcome:
    """How an execution ended, as the engine saw it."""

    exit_code: int
    error: str = ""


Emit = Callable[[Output], Coroutine[Any, Any, None]]


class Engine(abc.ABC):
    """One kind of engine. An instance lives as long as its EngineConn."""

    name: ClassVar[str]

    def __init__(self, params: dict[str, str]) -> None:
        self.params = params

    async def start(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Prepares the engine; an exception here is a fatal start-up error."""

    @abc.abstractmethod
    async def run(self, code: str, emit: Emit, cancel: asyncio.Event) -> Outcome:
        """Runs `code`, awaiting `emit` for each piece of output, and returns how it
        ended. When `cancel` is set the engine stops the code as well as it can and
        returns (the executor then reports cancelled=true)."""

    async def close(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Releases what the engine holds when the EngineConn stops."""


_END = object()  # marks the end of an execution's event queue


@dataclass
class _Execution:
    execution_id: str
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    events: asyncio.Queue[Any] = field(
        default_factory=lambda: asyncio.Queue(maxsize=_MAX_PENDING_EVENTS)
    )
    timed_out: bool = False
    task: asyncio.Task[Outcome] | None = None


class Executor:
    """Serves ExecutorService (registered with `add_ExecutorServiceServicer_to_server`)
    and tracks whether the EngineConn is busy and since when it is idle."""

    def __init__(self, engine: Engine, on_state_change: Callable[[], None]) -> None:
        self._engine = engine
        self._on_state_change = on_state_change
        self._current: _Execution | None = None
        self._idle_since = time.monotonic()
        self._closing = False
        self._background: set[asyncio.Task[Any]] = set()  # keeps them from being collected

    @property
    def busy(self) -> bool:
        """True while an execution runs (until its code has really stopped)."""
        return self._current is not None

    @property
    def idle_since(self) -> float:
        """time.monotonic() at which the last execution ended (or the executor started)."""
        return self._idle_since

    async def Execute(  # gRPC method name
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """Runs the code, streams OutputChunks and ends with the ExecuteResult."""
        code: str = request.code
        if not code.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "code must not be empty")
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the EngineConn is shutting down")
        if self._current is not None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"execution {self._current.execution_id} is running; "
                "an EngineConn runs one execution at a time",
            )
        # 128 random bits, like uuid4().hex (uuid is not imported just for this).
        execution = _Execution(request.execution_id or os.urandom(16).hex())
        timeout = 0.0
        if request.HasField("timeout"):
            timeout = request.timeout.seconds + request.timeout.nanos / 1e9
        self._start(execution, code, timeout)
        finished = False
        try:
            async for event in _coalesced(execution.events):
                if isinstance(event, Output):
                    yield executor_pb2.ExecuteResponse(
                        output=executor_pb2.OutputChunk(
                            stream=_PB_STREAM[event.stream], text=event.text
                        )
                    )
            assert execution.task is not None
            yield executor_pb2.ExecuteResponse(result=self._result(execution, execution.task))
            finished = True
        finally:
            if not finished:
                # The client went away: stop the code, and keep draining its output so
                # an engine waiting on the full queue can finish.
                execution.cancel.set()
                self._spawn(_drain(execution.events))

    async def Cancel(  # gRPC method name
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        """Cancels the running execution if it has this id (an empty id names whatever
        runs); cancelled=false means nothing matching was running."""
        current = self._current
        wanted: str = request.execution_id
        if current is None or (wanted and wanted != current.execution_id):
            return executor_pb2.CancelResponse(cancelled=False)
        log.info("cancel requested for execution %s", current.execution_id)
        current.cancel.set()
        return executor_pb2.CancelResponse(cancelled=True)

    async def shutdown(self, wait_seconds: float) -> None:
        """Refuses new executions, cancels the running one and waits (bounded) for its
        code to stop."""
        self._closing = True
        current = self._current
        if current is None or current.task is None:
            return
        current.cancel.set()
        await asyncio.wait({current.task}, timeout=wait_seconds)

    def _start(self, execution: _Execution, code: str, timeout: float) -> None:
        loop = asyncio.get_running_loop()

        async def emit(output: Output) -> None:
            await execution.events.put(output)

        task = loop.create_task(self._engine.run(code, emit, execution.cancel))
        execution.task = task
        timer = None
        if timeout > 0:

            def expire() -> None:
                execution.timed_out = True
                execution.cancel.set()

            timer = loop.call_later(timeout, expire)

        def done(_: asyncio.Task[Outcome]) -> None:
            if timer is not None:
                timer.cancel()
            # The end marker must wait for room too, or it could be lost on a full queue.
            self._spawn(execution.events.put(_END))
            self._current = None
            self._idle_since = time.monotonic()
            self._on_state_change()

        task.add_done_callback(done)
        self._current = execution
        log.info("execution %s started", execution.execution_id)
        self._on_state_change()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    def _result(execution: _Execution, task: asyncio.Task[Outcome]) -> Any:
        cancelled = execution.cancel.is_set()
        if task.cancelled():
            outcome = Outcome(exit_code=1, error="execution task was cancelled")
            cancelled = True
        elif (exc := task.exception()) is not None:
            log.error("execution %s failed in the engine: %r", execution.execution_id, exc)
            outcome = Outcome(exit_code=1, error=f"engine error: {exc!r}")
        else:
            outcome = task.result()
        error = outcome.error
        if execution.timed_out:
            error = (error + "\n" if error else "") + "timed out"
        log.info(
            "execution %s ended exit_code=%d cancelled=%s",
            execution.execution_id,
            outcome.exit_code,
            cancelled,
        )
        return executor_pb2.ExecuteResult(
            exit_code=outcome.exit_code, cancelled=cancelled, error=error
        )


async def _coalesced(events: asyncio.Queue[Any]) -> AsyncIterator[Output]:
    """The outputs up to the end marker, with the chunks already waiting of one stream
    merged (fewer, larger messages when the engine writes in small pieces) and none
    larger than _MAX_CHUNK_CHARS."""
    held: Any = None  # an event taken while merging that belongs to the next chunk
    while True:
        event = held if held is not None else await events.get()
        held = None
        if event is _END:
            return
        assert isinstance(event, Output)
        parts = [event.text]
        size = len(event.text)
        while size < _MAX_CHUNK_CHARS and not events.empty():
            nxt = events.get_nowait()
            if not (isinstance(nxt, Output) and nxt.stream == event.stream):
                held = nxt
                break
            parts.append(nxt.text)
            size += len(nxt.text)
        text = "".join(parts)
        # Also splits a single huge write: clients refuse messages over 4 MiB by default.
        for start in range(0, len(text), _MAX_CHUNK_CHARS):
            yield Output(event.stream, text[start : start + _MAX_CHUNK_CHARS])


async def _drain(events: asyncio.Queue[Any]) -> None:
    while await events.get() is not _END:
        pass
