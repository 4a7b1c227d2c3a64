"""The ECM agent daemon: registers with the RM, heartbeats (sequence-numbered, YARN
pull model), carries out the commands the RM pushes on a stream the agent opens
(the RM never connects to an agent), and reports its EngineConn processes.

    start ── register (retry with backoff) ── re-attach running EngineConns
      │
      ├── heartbeat loop: every interval ± jitter (pacing.py), or at once after a
      │      process event;
      │      REREGISTER -> register again; SHUTDOWN -> stop (EngineConns keep running)
      ├── command stream: launch / kill / clean up, each carried out once by id
      ├── one watcher per EngineConn process: its exit becomes a report
      └── with containment, the usage monitor: every `usage_interval` each EngineConn's
             cgroup is read (memory, CPU, OOM kills); the next heartbeat carries it, and
             an EngineConn whose OOM killer struck is stopped whole
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc
import tenacity
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import engine_conn_pb2_grpc, resource_manager_pb2_grpc, resource_pb2
from labelrm.v1 import resource_manager_pb2 as rm_pb

from ecm_agent.beats import HeartbeatSender
from ecm_agent.cgroups import Sample, cpu_millis_between
from ecm_agent.containment import Containment
from ecm_agent.launch import Launcher
from ecm_agent.pacing import next_beat_delay
from ecm_agent.settings import AgentSettings, detect_total, parse_labels
from ecm_agent.validate import AgentPolicy, LaunchRefused, LaunchSpec, MaterialFile
from labelrm_client._channel import ChannelSecurity, aio_channel

log = logging.getLogger(__name__)

SEEN_COMMANDS = 10_000
_STREAM_RETRY_MIN, _STREAM_RETRY_MAX = 0.5, 8.0  # seconds before reopening the command stream
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class RegistrationRefused(Exception):
    """The RM will not have this agent."""


class AgentStopped(Exception):
    """Raised out of a wait for the RM when the agent is told to stop."""


@dataclass
class _Process:
    """What the agent reports about one EngineConn until the RM says to forget it."""

    report: ec_pb.EngineConnProcess
    ended: bool = False
    last: Sample | None = None  # its cgroup's last figures
    fresh: resource_pb2.ResourceUsage | None = None  # measured, not yet reported
    stopping: bool = False  # over its memory: being stopped

    def measure(self, sample: Sample) -> None:
        """A new reading of its cgroup: the next heartbeat carries it."""
        self.fresh = usage_of(sample, self.last)
        self.last = sample

    def outgoing(self) -> ec_pb.EngineConnProcess:
        """Its report for the next heartbeat (with the newest measurement, if any)."""
        if self.fresh is None or self.ended:
            return self.report
        report = ec_pb.EngineConnProcess()
        report.CopyFrom(self.report)
        report.usage.CopyFrom(self.fresh)
        return report


def usage_of(sample: Sample, earlier: Sample | None) -> resource_pb2.ResourceUsage:
    """A cgroup reading as reported (CPU as millicores since the `earlier` reading)."""
    return resource_pb2.ResourceUsage(
        memory_bytes=sample.memory_bytes,
        memory_peak_bytes=sample.memory_peak_bytes,
        cpu_millis=cpu_millis_between(earlier, sample),
        cpu_time_micros=sample.cpu_usec,
    )


# gRPC's own reconnect backoff grows to 120 s while the RM is away: after an outage of a
# few minutes an agent would come back up to two minutes after the RM did, past the
# grace window the RM gives every agent once it hears again (measured: back 27 s after
# a 90 s outage). Retries are paced by `_retrying`; the channel just reconnects promptly.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


@dataclass
class Agent:
    settings: AgentSettings
    policy: AgentPolicy
    containment: Containment | None = None
    launcher: Launcher = field(init=False)
    _processes: dict[str, _Process] = field(default_factory=dict)
    _done: set[str] = field(default_factory=set)  # command ids carried out, not yet acked
    # Command ids carried out (bounded: the RM never re-sends an acknowledged one).
    _seen: dict[str, None] = field(default_factory=dict)
    _sequence: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _shut_down_by_rm: bool = False

    def __post_init__(self) -> None:
        self.launcher = Launcher(
            self.policy,
            fork_servers=self.settings.fork_servers,
            fork_server_idle=self.settings.fork_server_idle,
            containment=self.containment,
        )
        st = self.settings
        security = ChannelSecurity(st.tls_ca, st.tls_cert, st.tls_key, st.token)
        self.channel = aio_channel(st.rm, security, RECONNECT_OPTIONS)
        self.rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(self.channel)
        self.beats = HeartbeatSender(self.rm, timeout=10)
        self.ecs = engine_conn_pb2_grpc.EngineConnServiceStub(self.channel)

    @property
    def agent_id(self) -> str:
        return self.settings.agent_id

    # ----- lifecycle ---------------------------------------------------------------------

    async def run(self) -> None:
        """Run until told to shut down (by the RM, or by `stop()`)."""
        for proc in self.launcher.reattach():
            log.info("re-attached EngineConn %s (pid %d)", proc.ec_id, proc.engine_conn_pid)
            self._processes[proc.ec_id] = _Process(
                ec_pb.EngineConnProcess(
                    engine_conn_id=proc.ec_id,
                    state=ec_pb.PROCESS_STATE_RUNNING,
                    pid=proc.engine_conn_pid,
                    work_dir=str(proc.work_dir),
                )
            )
            self._spawn(self._watch(proc.ec_id))
        await self.launcher.sweep_cgroups()
        if self.containment is not None:
            self._spawn(self._monitor())
        try:
            await self.register()
            self._spawn(self._command_stream())
            await self._heartbeat_loop()
        except AgentStopped:
            log.info("stopped while waiting for the RM")
        finally:
            for task in list(self._tasks):
                task.cancel()
            for task in list(self._tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self._shut_down_by_rm:
                # For good (drained, or excluded): nothing of its EngineConns stays behind.
                log.warning("ending every EngineConn of this agent")
                await self.launcher.end_all()
            await self.launcher.close()
            self.beats.close()
            await self.channel.close()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _retrying(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Ride out RM restarts and network blips: exponential backoff, forever, one log
        line per retry, until the call succeeds or the agent is stopped (AgentStopped)."""
        retries = asyncio.ensure_future(self._retry_forever(call))
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({retries, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not retries.done():
                retries.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await retries
        if retries.cancelled():
            raise AgentStopped
        return retries.result()

    async def _retry_forever(self, call: Callable[[], Awaitable[Any]]) -> Any:
        async for attempt in tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, grpc.aio.AioRpcError) and e.code() in RETRYABLE
            ),
            wait=tenacity.wait_exponential_jitter(multiplier=0.1, max=5, jitter=0.1),
            before_sleep=self._log_retry,
        ):
            with attempt:
                return await call()
        raise AssertionError("unreachable")

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, grpc.aio.AioRpcError):
            why = f"{exc.code().name}: {' '.join(str(exc.details() or '').split())}"
        else:
            why = " ".join(str(exc).split())
        pause = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "RM %s unreachable (%s); retry %d in %.1fs",
            self.settings.rm,
            why[:300],
            state.attempt_number,
            pause,
        )

    async def register(self) -> None:
        total, protected = detect_total(self.settings)
        labels = [resource_pb2.Label(key=k, value=v) for k, v in parse_labels(self.settings.labels)]
        request = rm_pb.RegisterEcmRequest(
            request_id=f"register-{uuid.uuid4().hex}",
            instance=self.agent_id,
            labels=labels,
            total_resource=total,
            protected_resource=protected,
            isolation=self.isolation(),
        )
        try:
            await self._retrying(lambda: self.rm.RegisterEcm(request, timeout=10))
        except grpc.aio.AioRpcError as exc:
            # Refused (excluded by the node lists, bad settings): like a NodeManager
            # the RM disallows, the agent stops; an operator fixes it and restarts it.
            raise RegistrationRefused(f"{exc.code().name}: {exc.details()}") from exc
        self._sequence = 0
        log.info("registered as %s with %s", self.agent_id, self.settings.rm)

    def isolation(self) -> rm_pb.Isolation:
        """How this agent contains its EngineConns, as it registers it."""
        if self.containment is None:
            return rm_pb.Isolation(mode="none")
        layout = self.containment.layout
        return rm_pb.Isolation(
            mode=layout.mode, controllers=layout.controllers, cgroup_parents=layout.parents()
        )

    # ----- usage ---------------------------------------------------------------------------

    async def _monitor(self) -> None:
        """Reads every running EngineConn's cgroup each `usage_interval`; stops those over
        their memory (the kernel's OOM killer struck in their cgroup)."""
        while True:
            try:
                contained = self.launcher.contained()
                samples = await asyncio.to_thread(self.launcher.samples, contained)
            except OSError as exc:  # a kernel that refuses a read: the next round retries
                log.warning("reading the EngineConns' cgroups failed: %s", exc)
                samples = {}
            for ec_id, sample in samples.items():
                entry = self._processes.get(ec_id)
                if entry is None or entry.ended:
                    continue
                entry.measure(sample)
                if sample.oom_kills > 0 and not entry.stopping:
                    entry.stopping = True
                    self._spawn(self.launcher.stop_over_memory(ec_id))
            await asyncio.sleep(self.settings.usage_interval)

    # ----- heartbeats ----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval
        while not self._stop.is_set():
            # Cleared before the beat is built, not after it is answered: a process event
            # from now on (a launch carried out while this beat is in flight, or from its
            # answer's commands) wakes the next beat at once instead of an interval later.
            self._wake.clear()
            self._sequence += 1
            done = sorted(self._done)
            measured = [(p, p.fresh) for p in self._processes.values() if p.fresh is not None]
            request = rm_pb.HeartbeatRequest(
                agent_id=self.agent_id,
                sequence=self._sequence,
                engine_conns=[p.outgoing() for p in self._processes.values()],
                done_command_ids=done,
            )
            # A lost answer is retried with the same sequence; the RM replays it.
            sent_at = time.monotonic()
            response: rm_pb.HeartbeatResponse = await self._retrying(
                functools.partial(self.beats.send, request)
            )
            self._done.difference_update(done)
            for entry, usage in measured:
                if entry.fresh is usage:  # reported; a newer one waits for the next beat
                    entry.fresh = None
            if response.heartbeat_interval.ToNanoseconds() > 0:
                interval = response.heartbeat_interval.ToNanoseconds() / 1e9
            if response.action == rm_pb.HEARTBEAT_ACTION_REREGISTER:
                log.warning("RM asks to register again: %s", response.reason)
                await self.register()
                continue
            if response.action == rm_pb.HEARTBEAT_ACTION_SHUTDOWN:
                log.warning("RM asks this agent to shut down: %s", response.reason)
                self._shut_down_by_rm = True
                return
            for command in response.commands:
                await self._execute(command)
            delay = next_beat_delay(interval, time.monotonic() - sent_at, random.random())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    def _report_now(self) -> None:
        self._wake.set()

    # ----- commands ----------------------------------------------------------------------

    async def _command_stream(self) -> None:
        pause = _STREAM_RETRY_MIN
        while not self._stop.is_set():
            try:
                stream = self.ecs.StreamAgentCommands(
                    ec_pb.StreamAgentCommandsRequest(agent_id=self.agent_id)
                )
                async for item in stream:
                    pause = _STREAM_RETRY_MIN  # it was open: the next reopening is quick
                    await self._execute(item.command)
            except grpc.aio.AioRpcError as exc:
                log.info("command stream ended (%s); reopening in %.1fs", exc.code().name, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, _STREAM_RETRY_MAX)

    async def _execute(self, command: ec_pb.AgentCommand) -> None:
        """Carry out a command once, whichever way (stream or heartbeat) it arrived."""
        if command.command_id in self._seen:
            return
        self._seen[command.command_id] = None
        if len(self._seen) > SEEN_COMMANDS:
            for old in list(self._seen)[: SEEN_COMMANDS // 2]:
                del self._seen[old]
        which = command.WhichOneof("command")
        if which == "launch":
            await self._launch(command.launch)
        elif which == "kill":
            grace = command.kill.grace.ToNanoseconds() / 1e9 or None
            self._spawn(self.launcher.kill(command.kill.engine_conn_id, grace))
        elif which == "cleanup":
            ec_id = command.cleanup.engine_conn_id
            self._processes.pop(ec_id, None)
            self.launcher.forget(ec_id)
        self._done.add(command.command_id)
        if which == "launch":
            # A launch has its process (or its failure) to report at once. A kill's effect
            # is the exit, which reports itself (_watch); the acknowledgements of kills
            # and clean-ups ride on the next beat (a command not yet acknowledged is only
            # sent again, and carried out once).
            self._report_now()

    async def _launch(self, launch: ec_pb.LaunchCommand) -> None:
        request = launch.launch_request
        spec = LaunchSpec(
            ec_id=launch.engine_conn_id,
            user=launch.user,
            engine=launch.engine_type.split("-", 1)[0],
            program=request.program,
            argv=tuple(request.argv),
            environment=dict(request.environment),
            required_local_environment=tuple(request.required_local_environment),
            material_files=tuple(
                MaterialFile(m.name, m.content, m.executable) for m in request.material_files
            ),
            memory_bytes=launch.granted_memory_bytes,
            cpu_millis=launch.granted_cpu_millis,
        )
        report = ec_pb.EngineConnProcess(engine_conn_id=spec.ec_id)
        try:
            proc = await self.launcher.launch(spec)
        except LaunchRefused as exc:
            log.warning("refused to launch %s: %s", spec.ec_id, exc)
            report.state = ec_pb.PROCESS_STATE_LAUNCH_FAILED
            report.reason = str(exc)
            self._processes[spec.ec_id] = _Process(report, ended=True)
            return
        except OSError as exc:
            log.exception("launch of %s failed", spec.ec_id)
            report.state = ec_pb.PROCESS_STATE_LAUNCH_FAILED
            report.reason = f"launch failed: {exc}"
            self._processes[spec.ec_id] = _Process(report, ended=True)
            return
        report.state = ec_pb.PROCESS_STATE_RUNNING
        report.pid = proc.engine_conn_pid
        report.work_dir = str(proc.work_dir)
        self._processes[spec.ec_id] = _Process(report)
        log.info(
            "launched EngineConn %s as %s (pid %d)", spec.ec_id, spec.user, proc.engine_conn_pid
        )
        self._spawn(self._watch(spec.ec_id))

    async def _watch(self, ec_id: str) -> None:
        info = await self.launcher.wait_exit(ec_id)
        entry = self._processes.get(ec_id)
        if entry is None:
            return
        entry.report.state = ec_pb.PROCESS_STATE_EXITED
        entry.report.exit_code = info.exit_code if info.exit_code is not None else -1
        entry.report.log_tail = info.log_tail
        if info.exit_code is None:
            entry.report.reason = (
                "exit code unknown (re-attached after an agent restart, or its fork server "
                "went away)"
            )
        if info.usage is not None:
            entry.report.usage.CopyFrom(usage_of(info.usage, entry.last))
        if info.oom_reason:
            entry.report.out_of_memory = True
            entry.report.reason = info.oom_reason
        entry.ended = True
        log.info(
            "EngineConn %s exited with %s%s", ec_id, info.exit_code,
            f" ({info.oom_reason})" if info.oom_reason else "",
        )  # fmt: skip
        self._report_now()


def build_agent(settings: AgentSettings, containment: Containment | None = None) -> Agent:
    policy = AgentPolicy(
        work_root=settings.work_root,
        state_dir=settings.state_dir,
        allowed_users=frozenset(u for u in settings.allowed_users.split(",") if u),
        programs={"python": settings.python, "bash": "/bin/bash"},
        min_uid=settings.min_uid,
        local_env={"LABELRM_RM": settings.rm, "LABELRM_AGENT_ID": settings.agent_id},
        kill_grace=settings.kill_grace,
    )
    return Agent(settings, policy, containment)
