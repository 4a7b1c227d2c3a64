"""The benchmarks' native load generator (bench/native/loadgen.cc) against a live RM:
its apply cycles leave nothing charged and the server consistent, its simulated agents
register and heartbeat, and it refuses a bad command line.

The binary is built by this test's setup (bench/native: protoc + g++ with Debian's gRPC
C++ packages, cached by the hash of its sources). In CI (CI=true) a missing toolchain or
a failed build fails the test; elsewhere it skips.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from labelrm.v1 import resource_manager_pb2 as pb

from bench.native import NativeUnavailable, loadgen_binary
from tests.integration.test_metrics import scrape, value
from tests.support.env import unavailable
from tests.support.messages import GiB, load_instance, register
from tests.support.rm import assert_consistent, label_state, start_in_process, stop_in_process
from tests.support.waiting import wait_until


@pytest.fixture(scope="session")
def loadgen() -> Path:
    try:
        return loadgen_binary()
    except NativeUnavailable as exc:
        unavailable(f"the native load generator cannot be built: {exc}")


async def run(loadgen: Path, *args: str, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(loadgen),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def run_window(loadgen: Path, kind: str, target: str, *args: str) -> dict[str, Any]:
    """One run measured from half a second after start, for `--seconds` (in args)."""
    start_at = repr(time.time() + 0.5)
    code, out, err = await run(
        loadgen, kind, "--target", target, "--start-at", start_at, "--seed", "7", *args
    )
    assert code == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


async def test_apply_cycles_leave_nothing_charged(rm, loadgen):
    await rm.rm.RegisterEcm(register("bench0:9000", load_instance(1024 * GiB, 10**6, 10**4)))

    # Twice with the same seed: the second run's request ids must not be the first's.
    cycles = 0
    for _ in range(2):
        result = await run_window(
            loadgen, "apply", rm.target, "--clients", "4", "--seconds", "1.5", "--mode", "hot"
        )
        assert result["errors"] == {}
        cycles += result["count"]

    assert result["count"] > 0
    for rpc in ("Apply", "ReportUsed", "Release"):
        # A cycle counts when it ends in the window, a call's latency when it starts
        # there: only the four cycles under way at the window's start differ.
        assert len(result["latency"][rpc]) >= result["count"] - 4, rpc
        assert all(v > 0 for v in result["latency"][rpc]), rpc

    # Every cycle the generator counted is a ticket the RM released (a reused request id
    # would have replayed an earlier answer instead, and released nothing new).
    async def released(conn: Any) -> int:
        cur = await conn.execute(
            "SELECT count(*) FROM ticket_history WHERE final_state = 'RELEASED'"
        )
        row = await cur.fetchone()
        return int(row[0])

    assert await rm.core.db.run(released) >= cycles
    record = await label_state(rm, "emInstance=bench0:9000")
    assert record.locked_resource.load_instance.memory_bytes == 0
    assert record.used_resource.load_instance.memory_bytes == 0
    report = await assert_consistent(rm)
    assert report.labels_checked > 0


@pytest.fixture
async def rm_metrics(database_url):
    rm = await start_in_process(database_url, metrics_listen="127.0.0.1:0")
    try:
        yield rm
    finally:
        await stop_in_process(rm)


@pytest.mark.parametrize("rpc", ["stream", "unary"])
async def test_simulated_agents_register_and_heartbeat(rm_metrics, loadgen, rpc):
    rm = rm_metrics
    result = await run_window(
        loadgen,
        "heartbeat",
        rm.target,
        "--clients",
        "5",
        "--seconds",
        "2",
        "--interval",
        "0.5",
        "--agent-prefix",
        "native-",
        "--first-agent",
        "10",
        "--heartbeat-rpc",
        rpc,
    )

    assert result["errors"] == {}
    assert result["count"] > 0  # heartbeats answered in the window
    assert "HEARTBEAT_ACTION_REREGISTER" not in result["extra"]
    listed = await rm.rm.ListEcms(pb.ListEcmsRequest(page_size=100))
    states = {e.instance: pb.EcmState.Name(e.state) for e in listed.ecms}
    assert states == {f"native-{i}:9000": "ECM_STATE_RUNNING" for i in range(10, 15)}

    # The agents beat with rising sequence numbers: the RM holds the last one it answered.
    async def lowest_sequence(conn: Any) -> int:
        cur = await conn.execute(
            "SELECT min(heartbeat_seq) FROM ecm WHERE instance LIKE 'native-%'"
        )
        row = await cur.fetchone()
        return int(row[0])

    assert await rm.core.db.run(lowest_sequence) >= 2
    # As asked: one stream per agent (cancelled when the window closed) and no calls,
    # or calls and no stream.
    stream = "labelrm.v1.ResourceManagerService/HeartbeatStream"
    unary = "labelrm.v1.ResourceManagerService/Heartbeat"

    async def rpc_counts() -> tuple[float, float] | None:
        samples = await scrape(rm)
        streams = sum(
            v
            for (n, labels), v in samples.items()
            if n == "labelrm_rpc_total" and ("method", stream) in labels
        )
        calls = value(samples, "labelrm_rpc_total", method=unary, code="OK")
        return (streams, calls) if streams + calls >= 5 else None

    streams, calls = await wait_until(rpc_counts, timeout=10)
    if rpc == "stream":
        assert (streams, calls) == (5, 0)
    else:
        assert streams == 0 and calls >= result["count"]


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "no workload"),
        (["fly"], "unknown workload"),
        (["apply", "--target", "127.0.0.1:1", "--clients", "1"], "are required"),
        (["apply", "--clients", "x1"], "not a number: --clients"),
        (["apply", "--bogus", "1"], "unknown flag --bogus"),
        (["apply", "--target"], "no value for --target"),
        (
            [
                "heartbeat",
                "--target",
                "h:1",
                "--clients",
                "1",
                "--seconds",
                "1",
                "--start-at",
                "1",
                "--heartbeat-rpc",
                "x",
            ],
            "--heartbeat-rpc is stream or unary",
        ),
    ],
)
async def test_refuses_a_bad_command_line(loadgen, args, message):
    code, out, err = await run(loadgen, *args)
    assert code == 2
    assert out == ""
    assert message in err and "usage:" in err
