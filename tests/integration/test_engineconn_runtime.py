"""`python -m engineconn` as the agent runs it: a real process, a real executor server,
and a stand-in RM (a real gRPC server implementing only ReportEngineConnState)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import executor_pb2, executor_pb2_grpc

from tests.support.env import ROOT

IDLE = ec_pb.ENGINE_CONN_STATE_IDLE
BUSY = ec_pb.ENGINE_CONN_STATE_BUSY
SHUTTING_DOWN = ec_pb.ENGINE_CONN_STATE_SHUTTING_DOWN
SUCCEEDED = ec_pb.ENGINE_CONN_STATE_SUCCEEDED
FAILED = ec_pb.ENGINE_CONN_STATE_FAILED
STDOUT = executor_pb2.OUTPUT_STREAM_STDOUT
STDERR = executor_pb2.OUTPUT_STREAM_STDERR


class AuthedStub:
    """The executor stub with `authorization: Bearer <secret>` on every call (None: none)."""

    def __init__(self, channel: grpc.aio.Channel, secret: str | None) -> None:
        self.stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        self.metadata = (("authorization", f"Bearer {secret}"),) if secret else ()

    def Execute(self, request: Any, **kwargs: Any) -> Any:
        return self.stub.Execute(request, metadata=self.metadata, **kwargs)

    def Cancel(self, request: Any, **kwargs: Any) -> Any:
        return self.stub.Cancel(request, metadata=self.metadata, **kwargs)


@dataclass
class EC:
    proc: asyncio.subprocess.Process
    ec_id: str
    log_path: Path
    secret: str = ""
    address: str = ""
    channel: grpc.aio.Channel | None = None
    stub: AuthedStub | None = None
    extra: list[Any] = field(default_factory=list)

    def stub_with(self, secret: str | None) -> AuthedStub:
        assert self.channel is not None
        return AuthedStub(self.channel, secret)

    def log(self) -> str:
        return self.log_path.read_text()

    async def wait_exit(self, timeout: float = 5.0) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"engineconn still running; log:\n{self.log()}") from None


@pytest.fixture
async def start_ec(fake_rm, tmp_path):
    """Starts `python -m engineconn` against the fake RM and waits for its ready report."""
    started: list[EC] = []

    async def start(
        engine: str = "shell", *args: str, ready: bool = True, secret: str | None = "random"
    ) -> EC:
        """`secret`: LABELRM_EC_SECRET as the RM would set it ("random": a fresh one like
        the RM's; None: unset, as in a launch by an older RM)."""
        ec_id = f"ec-{uuid.uuid4().hex[:8]}"
        log_path = tmp_path / f"{ec_id}.log"
        if secret == "random":
            secret = secrets.token_urlsafe(32)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("LABELRM_EC_SECRET", None)
        if secret is not None:
            env["LABELRM_EC_SECRET"] = secret
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "engineconn",
                "--ec-id",
                ec_id,
                "--rm",
                fake_rm.target,
                "--engine",
                engine,
                "--heartbeat-interval",
                "0.2",
                *args,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                env=env,
            )
        ec = EC(proc, ec_id, log_path, secret or "")
        started.append(ec)
        if ready:
            report = await fake_rm.next_report(IDLE, timeout=8)
            assert report.engine_conn_id == ec_id
            assert not report.HasField("used_resource")
            ec.address = report.address
            ec.channel = grpc.aio.insecure_channel(report.address)
            ec.stub = AuthedStub(ec.channel, secret)
        return ec

    yield start
    for ec in started:
        if ec.proc.returncode is None:
            ec.proc.kill()
            await ec.proc.wait()
        if ec.channel is not None:
            await ec.channel.close()


@dataclass
class Run:
    stdout: str = ""
    stderr: str = ""
    # An ExecuteResult once the call ended with one (the generated protobuf code carries
    # no types here, so it is Any either way).
    result: Any = None


async def collect(call) -> Run:
    run = Run()
    # read(), not `async for`: grpc forbids mixing the two and read_until() uses read().
    while (response := await call.read()) is not grpc.aio.EOF:
        if response.HasField("output"):
            if response.output.stream == STDOUT:
                run.stdout += response.output.text
            else:
                run.stderr += response.output.text
        else:
            run.result = response.result
    return run


async def execute(ec: EC, code: str, **kwargs) -> Run:
    assert ec.stub is not None, "started with ready=False"
    return await collect(ec.stub.Execute(executor_pb2.ExecuteRequest(code=code, **kwargs)))


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (this box's init may not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def read_until(call, text: str, timeout: float = 5.0) -> str:
    """Reads output chunks until `text` has appeared (proves output streams before the end)."""
    seen = ""
    async with asyncio.timeout(timeout):
        while text not in seen:
            response = await call.read()
            assert response is not grpc.aio.EOF and response.HasField("output"), seen
            seen += response.output.text
    return seen


async def test_shell_streams_stdout_stderr_and_exit_code(start_ec, tmp_path):
    ec = await start_ec("shell")
    assert ec.address.startswith("127.0.0.1:")
    assert f"ec_id={ec.ec_id}" in ec.log() and "engine=shell" in ec.log()
    run = await execute(ec, "echo hi; echo err >&2; exit 3")
    assert run.stdout == "hi\n"
    assert run.stderr == "err\n"
    assert run.result.exit_code == 3 and not run.result.cancelled
    run = await execute(ec, "pwd")
    assert run.stdout.strip() == str(tmp_path)  # runs in the EngineConn's work directory
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await execute(ec, "  ")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_shell_output_is_streamed_before_the_end(start_ec):
    ec = await start_ec("shell")
    call = ec.stub.Execute(executor_pb2.ExecuteRequest(code="echo first; sleep 30"))
    await read_until(call, "first\n")
    assert (await ec.stub.Cancel(executor_pb2.CancelRequest())).cancelled
    run = await asyncio.wait_for(collect(call), 5)
    assert run.result.cancelled


async def test_shell_timeout_kills_the_process_group(start_ec, tmp_path):
    ec = await start_ec("shell")
    pid_file = tmp_path / "child.pid"
    timeout = {"timeout": {"nanos": 300_000_000}}
    run = await asyncio.wait_for(
        execute(ec, f"sleep 30 & echo $! > {pid_file}; wait", **timeout), 5
    )
    assert run.result.cancelled and "timed out" in run.result.error
    assert not running(int(pid_file.read_text()))  # the background child went with its group


async def test_python_session_keeps_state_and_reports_tracebacks(start_ec):
    ec = await start_ec("python")
    run = await execute(ec, "x = 41\nimport sys\nprint('to err', file=sys.stderr)")
    assert run.result.exit_code == 0 and run.stderr == "to err\n"
    run = await execute(ec, "x += 1\nprint(x)")
    assert run.stdout == "42\n" and run.result.exit_code == 0 and not run.result.error
    run = await execute(ec, "print('before')\n1/0")
    assert run.stdout == "before\n"
    assert run.result.exit_code == 1
    assert "ZeroDivisionError" in run.result.error and "Traceback" in run.result.error
    run = await execute(ec, "raise SystemExit(4)")
    assert run.result.exit_code == 4  # ends the execution, not the EngineConn
    run = await execute(ec, "print(x)")
    assert run.stdout == "42\n"


async def test_busy_while_running_and_cancel(start_ec, fake_rm):
    ec = await start_ec("shell")
    call = ec.stub.Execute(
        executor_pb2.ExecuteRequest(execution_id="long", code="echo go; sleep 30")
    )
    await read_until(call, "go\n")
    await fake_rm.next_report(BUSY)
    with pytest.raises(grpc.aio.AioRpcError) as err:  # one execution at a time
        await execute(ec, "echo second")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not (await ec.stub.Cancel(executor_pb2.CancelRequest(execution_id="other"))).cancelled
    assert (await ec.stub.Cancel(executor_pb2.CancelRequest(execution_id="long"))).cancelled
    run = await asyncio.wait_for(collect(call), 5)
    assert run.result.cancelled
    await fake_rm.next_report(IDLE)
    assert (await execute(ec, "echo again")).stdout == "again\n"


async def test_python_cancel_interrupts_running_code(start_ec, fake_rm):
    ec = await start_ec("python")
    call = ec.stub.Execute(
        executor_pb2.ExecuteRequest(code="print('spinning', flush=True)\nwhile True:\n    pass")
    )
    await read_until(call, "spinning")
    await fake_rm.next_report(BUSY)
    assert (await ec.stub.Cancel(executor_pb2.CancelRequest())).cancelled
    run = await asyncio.wait_for(collect(call), 5)
    assert run.result.cancelled and "KeyboardInterrupt" in run.result.error
    assert (await execute(ec, "print('still alive')")).stdout == "still alive\n"


async def test_python_cancel_interrupts_a_blocking_call(start_ec, fake_rm):
    """Code blocked in C (time.sleep) is interrupted too (the code runs on the main
    thread, which the cancel signals), and the session goes on with its namespace."""
    ec = await start_ec("python")
    assert (await execute(ec, "kept = 42")).result.exit_code == 0
    code = "import time\nprint('sleeping', flush=True)\ntime.sleep(3600)"
    call = ec.stub.Execute(executor_pb2.ExecuteRequest(code=code))
    await read_until(call, "sleeping")
    await fake_rm.next_report(BUSY)
    assert (await ec.stub.Cancel(executor_pb2.CancelRequest())).cancelled
    run = await asyncio.wait_for(collect(call), 30)
    assert run.result.cancelled and "KeyboardInterrupt" in run.result.error
    await fake_rm.next_report(IDLE)
    assert (await execute(ec, "print(kept)")).stdout == "42\n"


async def test_sigterm_stops_python_code_blocked_in_a_call(start_ec, fake_rm):
    """The agent's SIGTERM still stops the EngineConn while its code sleeps (a signal
    no cancel sent): the execution is cut short and the process exits."""
    ec = await start_ec("python")
    code = "import time\nprint('sleeping', flush=True)\ntime.sleep(3600)"
    call = ec.stub.Execute(executor_pb2.ExecuteRequest(code=code))
    await read_until(call, "sleeping")
    ec.proc.send_signal(signal.SIGTERM)
    await fake_rm.next_report(SHUTTING_DOWN)
    run = await asyncio.wait_for(collect(call), 30)
    assert run.result.cancelled
    await fake_rm.next_report(FAILED)
    assert await ec.wait_exit() == 0


async def test_max_idle_exits_cleanly(start_ec, fake_rm):
    """A stop of its own is news to the RM: SHUTTING_DOWN first, then its end."""
    ec = await start_ec("shell", "--max-idle-seconds", "1")
    await fake_rm.next_report(SHUTTING_DOWN, timeout=5)
    await fake_rm.next_report(SUCCEEDED)
    assert await ec.wait_exit() == 0


async def test_an_idle_engineconn_told_to_stop_reports_its_end_at_once(start_ec, fake_rm):
    """SIGTERM is how its agent carries out a kill the RM has recorded already: with
    nothing running there is nothing to announce, and the one report is its end."""
    ec = await start_ec("shell")
    await fake_rm.next_report(IDLE)
    ec.proc.send_signal(signal.SIGTERM)
    final = await fake_rm.next_report(SUCCEEDED)
    assert final.reason == "signal SIGTERM"
    assert await ec.wait_exit() == 0
    assert SHUTTING_DOWN not in [r.state for r in fake_rm.reports]


async def test_sigterm_cancels_the_running_execution_and_exits_cleanly(start_ec, fake_rm, tmp_path):
    """Its code stops and the process exits 0; the stop cut that execution short, so the
    EngineConn ends FAILED saying so (docs/architecture.md, "Ended on request")."""
    ec = await start_ec("shell")
    pid_file = tmp_path / "sleep.pid"
    code = f"sleep 30 & echo $! > {pid_file}; echo go; wait"
    call = ec.stub.Execute(executor_pb2.ExecuteRequest(code=code))
    await read_until(call, "go\n")
    ec.proc.send_signal(signal.SIGTERM)
    await fake_rm.next_report(SHUTTING_DOWN)
    run = await asyncio.wait_for(collect(call), 5)
    assert run.result.cancelled
    final = await fake_rm.next_report(FAILED)
    assert final.reason == "an execution was cut short (signal SIGTERM)"
    assert await ec.wait_exit() == 0
    assert not running(int(pid_file.read_text()))


async def test_client_going_away_stops_its_execution(start_ec, fake_rm):
    ec = await start_ec("shell")
    call = ec.stub.Execute(executor_pb2.ExecuteRequest(code="echo go; sleep 30"))
    await read_until(call, "go\n")
    await fake_rm.next_report(BUSY)
    call.cancel()
    await fake_rm.next_report(IDLE)
    assert (await execute(ec, "echo next")).stdout == "next\n"


async def test_shutdown_from_the_rm_stops_the_engineconn(start_ec, fake_rm):
    ec = await start_ec("python")
    fake_rm.shutdown = True
    assert await ec.wait_exit() == 0
    assert "no longer recognises" in ec.log()


async def test_bind_failure_reports_failed_and_exits_1(start_ec, fake_rm):
    ec = await start_ec("shell", "--listen", "192.0.2.1:0", ready=False)  # not our address
    report = await fake_rm.next_report(FAILED)
    assert "cannot listen" in report.reason
    assert await ec.wait_exit() == 1


def test_version_is_fast_and_imports_no_grpc():
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "engineconn", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=10,
        check=False,
    )
    assert out.returncode == 0
    assert out.stdout.strip() == "engineconn 0.1.0"
    assert "grpc" not in out.stderr and "asyncio" not in out.stderr


# --- the executor's secret --------------------------------------------------------------------


async def test_execute_and_cancel_need_the_secret(start_ec, fake_rm):
    ec = await start_ec("shell")
    wrong = secrets.token_urlsafe(32)
    refused = [ec.stub_with(None), ec.stub_with(wrong), ec.stub_with(ec.secret[:-1])]
    malformed = ec.stub_with(None)
    malformed.metadata = (("authorization", ec.secret),)  # no "Bearer " scheme
    for stub in (*refused, malformed):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub.Execute(executor_pb2.ExecuteRequest(code="id -un")))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ec.secret not in err.value.details()
    # Cancel too: a stranger must not stop the owner's execution either.
    call = ec.stub.Execute(executor_pb2.ExecuteRequest(code="echo go; sleep 30"))
    await read_until(call, "go\n")
    for stub in refused:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Cancel(executor_pb2.CancelRequest())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (await ec.stub.Cancel(executor_pb2.CancelRequest())).cancelled
    assert (await asyncio.wait_for(collect(call), 5)).result.cancelled
    # The scheme is case-insensitive (RFC 6750); the secret is not.
    lower = ec.stub_with(None)
    lower.metadata = (("authorization", f"bearer {ec.secret}"),)
    run = await collect(lower.Execute(executor_pb2.ExecuteRequest(code="echo ok")))
    assert run.stdout == "ok\n"
    # The code runs without the secret in its environment, and no log line shows it.
    run = await execute(ec, "env")
    assert "LABELRM_EC_SECRET" not in run.stdout and ec.secret not in run.stdout
    assert "refused" in ec.log() and ec.secret not in ec.log() and wrong not in ec.log()


async def test_without_a_secret_it_refuses_to_start(start_ec, fake_rm):
    ec = await start_ec("shell", ready=False, secret=None)
    assert await ec.wait_exit() == 2
    assert "nor LABELRM_EC_SECRET is set" in ec.log()
    assert not fake_rm.reports  # it never served anything nor told the RM it was ready


async def test_insecure_executor_flag_serves_without_a_secret(start_ec):
    ec = await start_ec("shell", "--insecure-executor", secret=None)
    assert (await execute(ec, "echo open")).stdout == "open\n"
    assert "WITHOUT authentication" in ec.log()
