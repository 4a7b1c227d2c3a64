"""Where executions run: on the process's main thread, with the event loop (gRPC, the
reports to the RM) on a thread of its own beside it.

Why the main thread: CPython runs signal handlers there only, and only there is a call
blocked in C (time.sleep, a socket read, a lock wait) interrupted by one. Code running in
a worker thread can be interrupted at its next bytecode at best, so a cancelled
`time.sleep(600)` kept its EngineConn BUSY for ten minutes. Here, cancelling sends the
main thread SIGINT; its handler raises KeyboardInterrupt in the code, whatever it waits
on. A SIGINT or SIGTERM from outside (the agent's kill) still stops the EngineConn: the
handler tells the two apart by whether a cancel asked for it.

`python -m engineconn` runs `serve` (engineconn.runtime.main). Engines used in a process
without it (tests that drive an engine on their own loop) run executions on a worker
thread instead, interrupted at the next bytecode (`WorkerThread`)."""

from __future__ import annotations

import asyncio
import ctypes
import queue
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

#: How long a stop signal may wait for its handler at most (see MainThread._next_job).
_SIGNAL_WAKE_SECONDS = 0.2


class Window(Protocol):
    """Brackets the user's code inside an execution's body: an interrupt is raised only
    between `open()` and `close()` (the body's own bookkeeping is never hit)."""

    def open(self) -> None: ...

    def close(self) -> None: ...


# An execution's body, given its window.
Job = Callable[[Window], None]


class Runner(Protocol):
    """Runs an execution's body away from the event loop, and interrupts it."""

    def start(self, job: Job) -> Callable[[], None]:
        """Starts `job`; returns what interrupts its code (once; nothing once the code
        has ended)."""
        ...


class MainThread:
    """The main thread serving executions while the event loop runs beside it."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._armed: object | None = None  # the job whose user code runs now (its token)
        self._interrupted: object | None = None  # the job a cancel was sent for
        self._cancels = 0  # SIGINTs sent by cancels whose handler has not run yet
        self._on_stop: Callable[[str], None] = lambda _reason: None
        self._loop: asyncio.AbstractEventLoop | None = None

    def serve(self, main: Coroutine[Any, Any, int], on_stop: Callable[[str], None]) -> int:
        """Runs `main` on an event loop in a thread of its own and executions here, until
        `main` ends; its result. `on_stop(reason)` runs on the loop for a SIGTERM or a
        SIGINT that no cancel sent."""
        self._on_stop = on_stop
        result: list[int] = []
        failure: list[BaseException] = []

        def loop_thread() -> None:
            try:
                result.append(asyncio.run(self._run(main)))
            except BaseException as exc:  # handed to the main thread, raised there
                failure.append(exc)
            finally:
                self._jobs.put(None)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signalled)
        thread = threading.Thread(target=loop_thread, name="engineconn-loop")
        thread.start()
        while (job := self._next_job()) is not None:
            job()
        thread.join()
        if failure:
            raise failure[0]
        return result[0]

    def _next_job(self) -> Callable[[], None] | None:
        """The next job (None: the loop has ended). Waits in slices: the kernel may give a
        SIGTERM to another thread (the loop's, gRPC's), and its handler then runs only
        once this thread runs Python code again; a wait with no end would hold a stop
        signal back for as long as no execution came (an idle EngineConn never stopped)."""
        while True:
            try:
                return self._jobs.get(timeout=_SIGNAL_WAKE_SECONDS)
            except queue.Empty:
                continue

    async def _run(self, main: Coroutine[Any, Any, int]) -> int:
        self._loop = asyncio.get_running_loop()
        return await main

    def start(self, job: Job) -> Callable[[], None]:
        token = object()
        main = self

        class _Window:
            def open(self) -> None:
                with main._lock:
                    cancelled = main._interrupted is token
                    main._armed = None if cancelled else token
                if cancelled:  # before the code started: it does not start
                    raise KeyboardInterrupt

            def close(self) -> None:
                with main._lock:
                    main._armed = None

        def run() -> None:
            window = _Window()
            try:
                job(window)
            finally:
                window.close()

        def interrupt() -> None:
            with self._lock:
                if self._interrupted is token:
                    return
                self._interrupted = token
                if self._armed is not token:  # not started (open() sees it) or ended
                    return
                self._cancels += 1
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

        self._jobs.put(run)
        return interrupt

    def _signalled(self, signum: int, _frame: object) -> None:
        with self._lock:
            ours = signum == signal.SIGINT and self._cancels > 0
            if ours:
                self._cancels -= 1
            hit = ours and self._armed is not None and self._armed is self._interrupted
        if hit:
            raise KeyboardInterrupt
        if ours:  # a cancel's signal that came after its code had ended: nothing to do
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            name = signal.Signals(signum).name
            loop.call_soon_threadsafe(self._on_stop, f"signal {name}")


class WorkerThread:
    """Runs each execution on a thread of its own (an engine without `serve`): its code
    is interrupted at its next bytecode, not in a call blocked in C."""

    def start(self, job: Job) -> Callable[[], None]:
        lock = threading.Lock()
        state = {"armed": False, "interrupted": False}

        class _Window:
            def open(self) -> None:
                with lock:
                    cancelled = state["interrupted"]
                    state["armed"] = not cancelled
                if cancelled:  # before the code started: it does not start
                    raise KeyboardInterrupt

            def close(self) -> None:
                with lock:
                    state["armed"] = False
                    if state["interrupted"]:  # one not fired yet must not hit what follows
                        _async_raise(threading.get_ident(), None)

        thread = threading.Thread(target=job, args=(_Window(),), name="python-execution")
        thread.daemon = True
        thread.start()

        def interrupt() -> None:
            with lock:
                if state["interrupted"] or thread.ident is None:
                    return
                state["interrupted"] = True
                if state["armed"]:
                    _async_raise(thread.ident, KeyboardInterrupt)

        return interrupt


def _async_raise(ident: int, kind: type[BaseException] | None) -> None:
    exc = ctypes.py_object(kind) if kind is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), exc)


#: Set by `python -m engineconn` (engineconn.runtime.main) before its loop starts.
MAIN: MainThread | None = None


def runner() -> Runner:
    """Where an execution runs in this process."""
    return MAIN if MAIN is not None else WorkerThread()
