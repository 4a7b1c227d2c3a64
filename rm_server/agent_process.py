"""The agents' process: `agent_listen` and the liveness judge, apart from the users.

With `agent_listen` set (and `agent_process`, the default), rm-server runs as two
processes (docs/architecture.md, "Which work runs where"):

- the users' process (the one started): `listen`, the console, the metrics endpoint,
  the demand planner, the ticket sweep; everything users can make the RM do;
- the agents' process (this module's `child_main`, started and supervised by the first
  through `AgentProcess`): `agent_listen` (agents' heartbeats and command streams,
  EngineConns' reports) and the liveness sweep that judges them, on an event loop of its
  own, which no user's call, list, demand or console page ever runs on.

Both are replicas of one RM on one database: every decision is a transaction under row
locks, wake-ups travel by PostgreSQL NOTIFY, background jobs hold leases
(architecture.md, "Several replicas on one database"), so nothing needs to be handed
between them; each simply leaves the other's work alone.

The two talk through the child's standard streams: its settings go in as one JSON line
on stdin, its ports come back as one JSON line on stdout once it serves. The users'
process stopping sends it SIGTERM (it drains, as the users' process does); stdin
closing without one means the users' process died: the child stops at once, freeing
`agent_listen` for the RM started next. A child
that dies is started again (a second later, then backing off up to 30 s); while it is
down agents retry with back-off, and the liveness it judged waits for it (or for
another replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from labelrm_common.signals import stop_signals
from rm_server.config import Settings

log = logging.getLogger(__name__)

READY_TIMEOUT = 120.0  # a child that migrates nothing serves in a few seconds
RESTART_FIRST = 1.0
RESTART_MAX = 30.0


def child_settings(settings: Settings, database_url: str) -> Settings:
    """What the agents' process runs with: the same settings, on the database the users'
    process resolved (its embedded one, if it started it), its metrics on a private
    loopback port the users' process folds into its own (`fetch_metrics`), no console."""
    return dataclasses.replace(
        settings,
        database_url=database_url,
        console_listen="",
        metrics_listen="127.0.0.1:0" if settings.metrics_listen else "",
    )


def encode_settings(settings: Settings) -> bytes:
    data = {
        f.name: str(v) if isinstance(v := getattr(settings, f.name), Path) else v
        for f in dataclasses.fields(settings)
    }
    return json.dumps(data).encode() + b"\n"


def decode_settings(line: bytes) -> Settings:
    data: dict[str, Any] = json.loads(line)
    for f in dataclasses.fields(Settings):
        if isinstance(f.default, Path):
            data[f.name] = Path(data[f.name])
    return Settings(**data)


class AgentProcess:
    """The users' process's handle on the agents' process: starts it and learns its
    ports (`start`), starts it again when it dies, stops it (`stop`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = 0  # agent_listen's port
        self.metrics_port = 0  # the child's private metrics endpoint (0: none)
        self._proc: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start the child and wait until it serves; OSError (with its exit) if it cannot."""
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name="agent-process")

    async def _spawn(self) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rm_server.agent_process",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"},
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(encode_settings(self.settings))
        await proc.stdin.drain()
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT)
        except TimeoutError:
            line = b""
        if not line:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            code = await proc.wait()
            raise OSError(f"the agents' process (agent_listen) did not start: exit {code}")
        ready = json.loads(line)
        self._proc = proc
        # A restarted child binds the configured address again (port 0, in tests: a new one).
        self.port = int(ready["agent_port"])
        self.metrics_port = int(ready.get("metrics_port", 0))
        log.info("agents' process %d serves agent_listen (port %d)", proc.pid, self.port)

    async def _supervise(self) -> None:
        delay = RESTART_FIRST
        while not self._stopping:
            assert self._proc is not None
            code = await self._proc.wait()
            if self._stopping:
                return
            log.error("agents' process %d exited (%s): starting it again", self._proc.pid, code)
            while not self._stopping:
                await asyncio.sleep(delay)
                try:
                    await self._spawn()
                except OSError as exc:
                    log.error("%s; trying again in %.0f s", exc, min(delay * 2, RESTART_MAX))
                    delay = min(delay * 2, RESTART_MAX)
                    continue
                delay = RESTART_FIRST
                break

    async def stop(self, grace: float) -> None:
        """Tell the child to drain (SIGTERM), wait `grace` plus its own clean-up, then
        kill it."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)  # drain, as this process does
                try:
                    await asyncio.wait_for(proc.wait(), grace + 15.0)
                except TimeoutError:
                    log.warning("agents' process %d did not stop: killed", proc.pid)
                    proc.kill()
                    await proc.wait()
        finally:
            # Closed while the loop runs, also when the child was gone first (a Ctrl-C
            # reaches the whole process group): left open, its pipe is closed by the
            # transport's finaliser after the loop has closed, which prints a traceback.
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()

    async def fetch_metrics(self) -> bytes:
        """The child's metrics exposition (empty when it has no endpoint or is down)."""
        if not self.metrics_port:
            return b""
        try:
            return await asyncio.wait_for(_http_get("127.0.0.1", self.metrics_port), 5.0)
        except (OSError, TimeoutError, ValueError):
            return b""


async def _http_get(host: str, port: int) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep or b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise ValueError("no metrics")
    return body


# ----- the child -----------------------------------------------------------------------------


async def _serve(settings: Settings, announce: Callable[[dict[str, int]], None]) -> None:
    from rm_server.server import RMServer, Role, start_unless_signalled, tune_collector

    stop = asyncio.Event()
    with stop_signals(stop.set):
        server = RMServer(settings, role=Role.AGENTS)
        if not await start_unless_signalled(server, stop):
            return
        tune_collector()
        announce({"agent_port": server.agent_port, "metrics_port": server.metrics_port})
        # stdin closes when the users' process stops or dies: then drain and go.
        loop = asyncio.get_running_loop()
        eof: Awaitable[bytes] = loop.run_in_executor(None, sys.stdin.buffer.read)
        waiting = asyncio.ensure_future(eof)
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((waiting, stopped), return_when=asyncio.FIRST_COMPLETED)
        # Told to stop (SIGTERM: the users' process drains): drain as it does. Orphaned
        # (stdin closed by its death): free agent_listen at once for the RM started next.
        orphaned = not stop.is_set()
        stopped.cancel()
        await server.stop(0.0 if orphaned else None)


class _Tagged(logging.Filter):
    """Marks every line the agents' process logs: ``rm_process=agents``."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rm_process = "agents"
        return True


def child_main() -> int:
    """The agents' process: settings from stdin, ports to stdout, until stdin closes."""
    from labelrm_common.logging import setup_logging
    from rm_server.main import run_on_loop

    settings = decode_settings(sys.stdin.buffer.readline())
    setup_logging(settings.log_level, settings.log_format)
    for handler in logging.getLogger().handlers:  # its lines share the users' process's log
        handler.addFilter(_Tagged())
    out = sys.stdout

    def announce(ports: dict[str, int]) -> None:
        out.write(json.dumps(ports) + "\n")
        out.flush()

    with contextlib.suppress(KeyboardInterrupt):
        run_on_loop(_serve(settings, announce), settings.event_loop)
    # The executor thread still blocks on stdin if a signal ended us: do not wait for it.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(child_main())
