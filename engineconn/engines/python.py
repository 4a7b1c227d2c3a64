"""The python engine: a persistent interpreter session. One namespace lives as long as
the EngineConn, so `x = 1` in one execution and `print(x)` in the next works.

Code runs on the process's main thread while the event loop keeps serving gRPC and the
reports beside it (engineconn/mainthread.py), with sys.stdout / sys.stderr swapped for
writers that forward into the execution's stream. The swap is process-wide, which is
safe because an EngineConn runs one execution at a time (see engineconn.executor); the
runtime's own logging keeps the real stderr.

Cancel raises KeyboardInterrupt in the code, also in a call blocked in C (time.sleep, a
socket read): the main thread gets a signal. Code that catches KeyboardInterrupt and goes
on, or a C extension that ignores signals, still runs until it returns.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import io
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from engineconn import mainthread
from engineconn.executor import STDERR, STDOUT, Emit, Engine, Outcome, Output

_CANCEL_EXIT_CODE = 130  # as a shell reports an interrupted program
# A writer waits (backpressure) while this much output is not yet taken by the loop.
_HIGH_WATER_CHARS = 1024 * 1024


class _Pipe:
    """Carries the execution thread's output to the event loop. A write only appends under
    a lock and wakes the loop when the buffer was empty, so printing line by line costs
    no thread round trip; the loop takes everything written so far in one go (stdout and
    stderr in their order). A writer far ahead of the client waits for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cond = threading.Condition()
        self._items: list[tuple[str, list[str]]] = []  # (stream, parts)
        self._pending = 0
        self._wake_scheduled = False
        self._closed = False
        self._ready = asyncio.Event()

    def write(self, stream: str, text: str) -> None:
        """From the execution thread: queues the text, waiting while too much is pending."""
        with self._cond:
            while self._pending > _HIGH_WATER_CHARS and not self._closed:
                # Short waits: an interrupt (cancel) is delivered between them.
                self._cond.wait(0.1)
            # Parts are joined when taken: concatenating here would be quadratic.
            if self._items and self._items[-1][0] == stream:
                self._items[-1][1].append(text)
            else:
                self._items.append((stream, [text]))
            self._pending += len(text)
            wake = not self._wake_scheduled
            self._wake_scheduled = True
        if wake:
            self._loop.call_soon_threadsafe(self._ready.set)

    def close(self) -> None:
        """From the execution thread, once its code has ended."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._loop.call_soon_threadsafe(self._ready.set)

    async def forward(self, emit: Emit) -> None:
        """On the loop: emits the output until the pipe is closed and empty."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            with self._cond:
                items, self._items = self._items, []
                self._pending = 0
                self._wake_scheduled = False
                closed = self._closed
                self._cond.notify_all()
            for stream, parts in items:
                await emit(Output(stream, "".join(parts)))
            if closed:
                return


class _Writer(io.TextIOBase):
    """sys.stdout / sys.stderr during an execution: text goes into the pipe."""

    def __init__(self, stream: str, pipe: _Pipe) -> None:
        super().__init__()
        self._stream = stream
        self._pipe = pipe

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only in io.TextIOBase too
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            self._pipe.write(self._stream, text)
        return len(text)


class _Run:
    """One execution, run away from the event loop (mainthread.runner()), and the means
    to interrupt it."""

    def __init__(self, code: str, namespace: dict[str, Any]) -> None:
        self.code = code
        self.namespace = namespace
        self.loop = asyncio.get_running_loop()
        self.pipe = _Pipe(self.loop)
        self.done: asyncio.Future[Outcome] = self.loop.create_future()
        self.interrupt: Callable[[], None] = lambda: None

    def start(self) -> None:
        self.interrupt = mainthread.runner().start(self._main)

    def _main(self, window: mainthread.Window) -> None:
        stdout = _Writer(STDOUT, self.pipe)
        stderr = _Writer(STDERR, self.pipe)
        saved = sys.stdout, sys.stderr
        outcome = Outcome(exit_code=1, error="execution ended abnormally")
        try:
            try:
                sys.stdout, sys.stderr = stdout, stderr
                compiled = compile(self.code, "<execution>", "exec")
                window.open()
                try:
                    exec(compiled, self.namespace)  # running user code is the point
                finally:
                    window.close()
                outcome = Outcome(exit_code=0)
            except KeyboardInterrupt as exc:
                outcome = Outcome(exit_code=_CANCEL_EXIT_CODE, error=_format(exc))
            except SystemExit as exc:
                # exit(n) in user code ends the execution, never the EngineConn.
                outcome = _exit_outcome(exc)
            except BaseException as exc:
                outcome = Outcome(exit_code=1, error=_format(exc))
            finally:
                sys.stdout, sys.stderr = saved
        finally:
            # The loop is closed if the EngineConn ended without waiting for us.
            with contextlib.suppress(RuntimeError):
                self.pipe.close()
                self.loop.call_soon_threadsafe(_resolve, self.done, outcome)


def _resolve(future: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)


def _exit_outcome(exc: SystemExit) -> Outcome:
    if exc.code is None:
        return Outcome(exit_code=0)
    if isinstance(exc.code, int):
        return Outcome(exit_code=exc.code)
    return Outcome(exit_code=1, error=str(exc.code))


def _format(exc: BaseException) -> str:
    # Drop our own frame (the exec call): the user wants to see their code only.
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code is _Run._main.__code__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


class PythonEngine(Engine):
    """A persistent Python session; see the module docstring."""

    name = "python"

    def __init__(self, params: dict[str, str]) -> None:
        super().__init__(params)
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}

    async def run(self, code: str, emit: Emit, cancel: asyncio.Event) -> Outcome:
        """Runs `code` in the session's namespace, away from the event loop."""
        run = _Run(code, self.namespace)
        forwarding = asyncio.ensure_future(run.pipe.forward(emit))
        run.start()
        cancelled = asyncio.ensure_future(cancel.wait())
        waits: list[asyncio.Future[Any]] = [run.done, cancelled]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not run.done.done():
                run.interrupt()
            # Wait for the code to really stop: until then the session is not free.
            outcome = await asyncio.shield(run.done)
            await forwarding  # the rest of the output goes before the result
            return outcome
        finally:
            cancelled.cancel()
            forwarding.cancel()


ENGINE = PythonEngine
