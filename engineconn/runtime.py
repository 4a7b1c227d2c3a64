"""The EngineConn process: creation context, executor server, state reports to the RM,
idle exit and signal handling.

Life: serve ExecutorService -> report IDLE with the address (the RM's "ready") ->
heartbeat IDLE / BUSY (at once on a change, else every interval) -> on max idle time,
SIGTERM / SIGINT, or shutdown=true from the RM: report SHUTTING_DOWN, cancel what
runs, report SUCCEEDED, exit 0. A fatal error reports FAILED (if it can) and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import grpc
from labelrm.v1 import engine_conn_pb2, engine_conn_pb2_grpc, executor_pb2_grpc

from engineconn import mainthread
from engineconn.auth import SECRET_ENV, SECRET_FILE_ENV, SecretAuth
from engineconn.engines import load_engine
from engineconn.executor import Executor
from engineconn.settings import EngineConnSettings, load_settings, pairs

log = logging.getLogger("engineconn")

FIRST_REPORT_DEADLINE_SECONDS = 30.0
_REPORT_CALL_TIMEOUT = 5.0
# Reports made while stopping: short, as the agent sends KILL after its grace period.
_FINAL_REPORT_TIMEOUT = 1.0
_CANCEL_WAIT_SECONDS = 3.0
# grpc's own reconnect backoff (1 s growing to 120 s) would fail our retries fast while
# the RM is already back; keep it short so an RM that comes up is reached at once.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

State = engine_conn_pb2


class FatalError(Exception):
    """Start-up cannot go on: report FAILED and exit 1."""


@dataclass(frozen=True)
class CreationContext:
    """What this EngineConn was created as (from its arguments and its process)."""

    ec_id: str
    engine: str
    labels: Mapping[str, str]
    params: Mapping[str, str]
    user: str
    work_dir: str

    def log_line(self) -> str:
        """One key=value line (values shell-quoted) for the logs."""
        fields: list[tuple[str, str]] = [
            ("ec_id", self.ec_id),
            ("engine", self.engine),
            ("user", self.user),
            ("work_dir", self.work_dir),
        ]
        fields += [(f"label.{k}", v) for k, v in sorted(self.labels.items())]
        fields += [(f"param.{k}", v) for k, v in sorted(self.params.items())]
        return "creation context: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in fields)


Settings = EngineConnSettings
"""How this EngineConn runs (engineconn/settings.py declares each setting)."""


def rm_channel(settings: Settings, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
    """The channel to the RM: mutual TLS when the launch gave us a certificate."""
    if not (settings.tls_ca or settings.tls_cert):
        return grpc.aio.insecure_channel(settings.rm, options=list(options))
    # Read once at start-up: the files are ours (0640), and a key that vanishes
    # later must not break a running EngineConn.
    root = _read(settings.tls_ca) if settings.tls_ca else None
    key = _read(settings.tls_key) if settings.tls_key else None
    chain = _read(settings.tls_cert) if settings.tls_cert else None
    creds = grpc.ssl_channel_credentials(root, key, chain)
    return grpc.aio.secure_channel(settings.rm, creds, options=list(options))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _user() -> str:
    """getpass.getuser() without importing getpass (and termios): the first of LOGNAME,
    USER, LNAME, USERNAME, else the password database."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if user := os.environ.get(name):
            return user
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def creation_context(settings: Settings) -> CreationContext:
    """What the settings say this EngineConn was created as, with its user and directory."""
    return CreationContext(
        ec_id=settings.ec_id,
        engine=settings.engine,
        labels=MappingProxyType(pairs(settings.labels)),
        params=MappingProxyType(pairs(settings.params)),
        user=_user(),
        work_dir=os.getcwd(),
    )


class Runtime:
    """One EngineConn process."""

    def __init__(self, context: CreationContext, settings: Settings) -> None:
        self.context = context
        self.settings = settings
        self.address = ""
        self._interval = settings.heartbeat_interval
        self._stop: asyncio.Future[str] | None = None
        self._stop_told = False
        self._changed = asyncio.Event()  # wakes the heartbeat and the idle watch
        self._executor: Executor | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._auth: list[SecretAuth] = []  # the executor's interceptor (none: insecure)

    def request_stop(self, reason: str, *, told: bool = False) -> None:
        """Starts the orderly shutdown (first reason wins). `told`: the stop came from
        outside (the RM's answer, or a signal: how its agent carries out a kill, which
        the RM recorded as SHUTTING_DOWN when it ordered it)."""
        if self._stop is not None and not self._stop.done():
            log.info("stopping: %s", reason)
            self._stop_told = told
            self._stop.set_result(reason)

    def stop_on_signal(self, reason: str) -> None:
        """A SIGTERM or SIGINT: `request_stop`, told."""
        self.request_stop(reason, told=True)

    async def run(self) -> int:
        """Runs the EngineConn to its end; returns the process exit code."""
        loop = asyncio.get_running_loop()
        self._stop = loop.create_future()
        if threading.current_thread() is threading.main_thread():
            # Run on its own (not by `main`, whose main thread takes the signals).
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop_on_signal, f"signal {sig.name}")
        server: grpc.aio.Server | None = None
        try:
            self._channel = rm_channel(self.settings, _CHANNEL_OPTIONS)
        except OSError as exc:
            log.error("cannot read the TLS files: %s", exc)
            return 1
        self._stub = engine_conn_pb2_grpc.EngineConnServiceStub(self._channel)
        try:
            try:
                server = await self._serve()
            except Exception as exc:
                raise FatalError(f"start-up failed: {exc}") from exc
            # A signal during the first report (which may retry for long) must win.
            first = asyncio.create_task(self._first_report())
            waits: list[asyncio.Future[Any]] = [first, self._stop]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not first.done():
                first.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await first
            elif not first.result():
                return 1
            return await self._live(server)
        except FatalError as exc:
            log.error("%s", exc)
            await self._final_report(State.ENGINE_CONN_STATE_FAILED, str(exc))
            return 1
        except Exception as exc:  # a bug: still tell the RM why we are going away
            log.exception("fatal error")
            await self._final_report(State.ENGINE_CONN_STATE_FAILED, f"internal error: {exc!r}")
            return 1
        finally:
            if server is not None:
                await server.stop(grace=0.5)
            for auth in self._auth:
                auth.close()  # the refusals still counted get their line
            await self._channel.close()

    async def _serve(self) -> grpc.aio.Server:
        engine = load_engine(self.context.engine)(dict(self.context.params))
        await engine.start()
        self._executor = Executor(engine, self._changed.set)
        # The port is open to every local user: with a secret, only its holders get in.
        secret = self.settings.executor_secret
        self._auth = auth = [SecretAuth(secret)] if secret else []
        # No SO_REUSEPORT: a --listen port in use must fail, not be shared with another.
        server = grpc.aio.server(interceptors=auth, options=[("grpc.so_reuseport", 0)])
        executor_pb2_grpc.add_ExecutorServiceServicer_to_server(self._executor, server)
        try:
            port = server.add_insecure_port(self.settings.listen)
        except RuntimeError as exc:
            raise FatalError(f"cannot listen on {self.settings.listen}: {exc}") from exc
        if port == 0:  # older grpc reports a failed bind this way
            raise FatalError(f"cannot listen on {self.settings.listen}")
        await server.start()
        self.address = f"{self.settings.advertise_host}:{port}"
        log.info("executor serving on %s (engine %s)", self.address, engine.name)
        if not auth:
            log.warning(
                "executor WITHOUT authentication (--insecure-executor): any local user "
                "can run code as %s",
                self.context.user,
            )
        return server

    async def _first_report(self) -> bool:
        """The ready signal: IDLE with the address, retried while the RM is unreachable."""
        try:
            response = await self._report(self._state(), deadline=FIRST_REPORT_DEADLINE_SECONDS)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _RETRYABLE:
                log.error("RM %s unreachable for the first report: %s", self.settings.rm, exc)
                return False
            raise FatalError(f"RM refused the first report: {exc.code()} {exc.details()}") from exc
        log.info("ready: reported IDLE at %s", self.address)
        self._absorb(response)
        return True

    async def _live(self, server: grpc.aio.Server) -> int:
        assert self._stop is not None and self._executor is not None
        tasks = [asyncio.create_task(self._heartbeats()), asyncio.create_task(self._idle_watch())]
        try:
            reason = await self._stop
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # A stop that cuts an execution short fails that work: FAILED, else SUCCEEDED (the
        # one rule for ends on request, docs/architecture.md "Ended on request").
        cut_short = self._executor.busy
        if cut_short or not self._stop_told:
            # The RM must not hand it out while it stops: stopping an execution may take
            # the cancel's wait, and a stop of its own (idle) is news to the RM. Told to
            # stop with nothing running, it reports its end at once: one report fewer for
            # every kill (a launch's reports are a share of the RM's time).
            await self._final_report(State.ENGINE_CONN_STATE_SHUTTING_DOWN, reason)
        await self._executor.shutdown(_CANCEL_WAIT_SECONDS)
        # Lets a cancelled Execute deliver its result before the server goes.
        await server.stop(grace=0.5)
        if cut_short:
            await self._final_report(
                State.ENGINE_CONN_STATE_FAILED, f"an execution was cut short ({reason})"
            )
        else:
            await self._final_report(State.ENGINE_CONN_STATE_SUCCEEDED, reason)
        return 0

    def _state(self) -> Any:
        if self._executor is not None and self._executor.busy:
            return State.ENGINE_CONN_STATE_BUSY
        return State.ENGINE_CONN_STATE_IDLE

    def _absorb(self, response: Any) -> None:
        if response.HasField("heartbeat_interval"):
            interval = response.heartbeat_interval.ToTimedelta().total_seconds()
            if interval > 0:
                self._interval = interval
        if response.shutdown:
            self.request_stop("the RM no longer recognises this EngineConn", told=True)

    async def _heartbeats(self) -> None:
        while True:
            # A state change is reported at once (a BUSY EngineConn must not be handed
            # out); otherwise every interval.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._interval)
            self._changed.clear()
            try:
                self._absorb(await self._report(self._state(), deadline=self._interval))
            except grpc.aio.AioRpcError as exc:
                # The RM may be restarting: keep serving; it marks us LOST if this lasts.
                log.warning("heartbeat failed: %s %s", exc.code(), exc.details())

    async def _idle_watch(self) -> None:
        assert self._executor is not None
        limit = self.settings.max_idle_seconds
        if limit <= 0:
            return
        while True:
            # No wake-up on state changes needed: after any sleep the deadline is
            # recomputed from idle_since, which an execution in between has moved.
            remaining = limit
            if not self._executor.busy:
                remaining = self._executor.idle_since + limit - time.monotonic()
                if remaining <= 0:
                    self.request_stop(f"idle for {limit:g} s")
                    return
            await asyncio.sleep(remaining)

    async def _report(self, state: Any, *, deadline: float, reason: str = "") -> Any:
        """Reports `state`, retrying with backoff on UNAVAILABLE until `deadline` seconds."""
        request = engine_conn_pb2.ReportEngineConnStateRequest(
            engine_conn_id=self.context.ec_id, state=state, address=self.address, reason=reason
        )
        started = time.monotonic()
        try:
            return await self._stub.ReportEngineConnState(
                request, timeout=min(_REPORT_CALL_TIMEOUT, deadline)
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _RETRYABLE:
                raise
            log.info("RM unreachable (%s), retrying", exc.code())
        # tenacity is imported only here: the usual start never pays for it.
        import tenacity

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_delay(max(0.0, deadline - (time.monotonic() - started))),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=0.5, jitter=0.1),
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, grpc.aio.AioRpcError) and e.code() in _RETRYABLE
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                remaining = deadline - (time.monotonic() - started)
                return await self._stub.ReportEngineConnState(
                    request, timeout=max(0.1, min(_REPORT_CALL_TIMEOUT, remaining))
                )
        raise AssertionError("unreachable: tenacity reraises the last error")

    async def _final_report(self, state: Any, reason: str) -> None:
        # Best effort and quick: the process ends whatever the RM says.
        try:
            await self._report(state, deadline=_FINAL_REPORT_TIMEOUT, reason=reason)
        except grpc.aio.AioRpcError as exc:
            log.warning("could not report %s: %s", State.EngineConnState.Name(state), exc.code())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m engineconn`."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    loaded = load_settings(argv)
    if loaded.print_config:
        print(loaded.describe())
        return 0
    settings = loaded.settings
    context = creation_context(settings)
    # Executions inherit this process's environment: the secret is the executor's, not
    # something user code (which may print its environment anywhere) needs to see.
    os.environ.pop(SECRET_ENV, None)
    os.environ.pop(SECRET_FILE_ENV, None)
    log.info("%s", context.log_line())
    runtime = Runtime(context, settings)
    # Executions run on this (the main) thread, the loop beside it: engineconn/mainthread.py.
    mainthread.MAIN = mainthread.MainThread()
    try:
        return mainthread.MAIN.serve(runtime.run(), runtime.stop_on_signal)
    except KeyboardInterrupt:
        return 130
