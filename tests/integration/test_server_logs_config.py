"""rm-server as a real process: `--log-format json` writes one JSON event per line with
the request_id and the caller of each RPC; `--print-config` prints the effective
configuration with sources and exits; `--metrics-listen` serves a scrape."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import grpc
from labelrm.v1 import resource_manager_pb2_grpc

from bench.serving import free_port
from tests.support.env import ROOT, remove_with_relocated, shared_tmp
from tests.support.messages import GiB, apply_req, load, load_instance, register
from tests.support.waiting import wait_serving

LABELS = "userCreator=alice-IDE,engineType=spark-3.2.1,emInstance=host1:9000"


def test_json_logs_carry_request_id_and_peer(rm_process_factory):
    metrics_port = free_port()
    proc = rm_process_factory(
        "--log-format", "json", "--metrics-listen", f"127.0.0.1:{metrics_port}"
    )
    proc.start()
    with grpc.insecure_channel(proc.target) as channel:
        stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        stub.RegisterEcm(register("host1:9000", load_instance(4 * GiB, 4000, 2)), timeout=10)
        stub.Apply(apply_req(LABELS, load(GiB, 100), request_id="json-log-1"), timeout=10)
        try:
            stub.Apply(apply_req(LABELS, load(8 * GiB, 100), request_id="json-log-2"), timeout=10)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    assert 'labelrm_apply_total{outcome="granted"} 1.0' in text
    assert 'labelrm_apply_total{outcome="insufficient_resource"} 1.0' in text
    proc.terminate()

    lines = [line for line in proc.log_path.read_text().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # every line is one JSON event
    assert all({"ts", "level", "logger", "msg"} <= set(e) for e in events)
    by_id = {e.get("request_id"): e for e in events if e.get("event") == "rpc"}
    granted, refused = by_id["json-log-1"], by_id["json-log-2"]
    assert granted["method"] == "labelrm.v1.ResourceManagerService/Apply"
    assert granted["code"] == "OK" and granted["peer"].startswith("ipv4:127.0.0.1:")
    assert refused["code"] == "RESOURCE_EXHAUSTED"
    assert refused["reason"] == "INSUFFICIENT_RESOURCE"
    assert any("listening" in e["msg"] for e in events)


def test_print_config_prints_sources_and_exits(tmp_path):
    config = tmp_path / "rm.toml"
    config.write_text('pool_max = 5\nlisten = "127.0.0.1:7999"\n')
    env = {**os.environ, "LABELRM_CONFIG": str(config), "LABELRM_POOL_MAX": "6"}
    env.pop("LABELRM_LISTEN", None)
    out = subprocess.run(
        [sys.executable, "-m", "rm_server", "--print-config", "--log-format", "json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"# config file: {config}" in out
    assert 'listen = "127.0.0.1:7999"  # file' in out
    assert "pool_max = 6  # env" in out
    assert 'log_format = "json"  # flag' in out
    assert "lock_timeout = 600.0  # default" in out


def test_embedded_server_stderr_holds_only_its_own_json_lines():
    """With --log-format json every line rm-server writes is one JSON event, from start
    to stop: the embedded PostgreSQL logs to its own file in the data directory and
    gRPC's C core prints nothing of its own (it wrote `I1126 … fork_posix.cc:71] Other
    threads are currently calling into gRPC, skipping fork() handlers` when the server
    stopped the database) unless the operator sets GRPC_VERBOSITY."""
    data_root = shared_tmp("lrm-logs-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    target = f"127.0.0.1:{free_port()}"
    stderr = data_root / "stderr"
    try:
        with stderr.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rm_server", "--listen", target,
                 "--data-dir", str(data_root / "data"), "--log-format", "json"],
                stdout=sink, stderr=sink, cwd=ROOT, env=env,
            )  # fmt: skip
        try:
            wait_serving(target, 90)
            with grpc.insecure_channel(target) as channel:
                stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
                stub.RegisterEcm(
                    register("host1:9000", load_instance(4 * GiB, 4000, 2)), timeout=10
                )
                stub.Apply(apply_req(LABELS, load(GiB, 100)), timeout=10)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        lines = stderr.read_text().splitlines()
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                raise AssertionError(f"not a JSON event on stderr: {line!r}") from None
            assert {"ts", "level", "logger", "msg"} <= set(event), line
        assert any("embedded PostgreSQL running" in json.loads(x)["msg"] for x in lines)
        # PostgreSQL's own lines are in its log file, where docs/operations.md says.
        pg_log = (data_root / "data" / "pgdata" / "log").read_text()
        assert "database system is ready to accept connections" in pg_log
    finally:
        remove_with_relocated(data_root)
