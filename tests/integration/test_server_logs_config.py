"""rm-server as a real process: `--log-format json` writes one JSON event per line with
the request_id and the caller of each RPC; `--print-config` prints the effective
configuration with sources and exits; `--metrics-listen` serves a scrape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import grpc
from labelrm.v1 import resource_manager_pb2_grpc

from tests.conftest import ROOT, free_port
from tests.helpers import GiB, apply_req, load, load_instance, register

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
