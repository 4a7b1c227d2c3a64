"""Any language: a Node.js client (@grpc/grpc-js + @grpc/proto-loader, reading the
shipped .proto files) runs register -> apply -> report-used -> release against a live RM.

The npm packages are installed by this test's setup (bench/node_modules.py: `npm ci` from
the committed tests/nodejs/package-lock.json into a cache directory, reused while the
lock file is unchanged).
In CI (CI=true) a missing node/npm or a failed install fails the test; elsewhere it skips.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from labelrm.v1 import resource_manager_pb2 as pb

from bench.node_modules import PROTO_ROOT, WKT_DIR, NodeUnavailable
from bench.node_modules import node_modules as install_node_modules
from tests.support.env import ROOT, unavailable
from tests.support.messages import GiB
from tests.support.rm import assert_consistent, label_state

NODE_DIR = ROOT / "tests" / "nodejs"


def _unavailable(reason: str) -> None:
    unavailable(f"the Node.js client test cannot run: {reason}")


@pytest.fixture(scope="session")
def node_modules() -> Path:
    try:
        return install_node_modules()
    except NodeUnavailable as exc:
        _unavailable(str(exc))
        raise


async def test_nodejs_client_apply_report_release(rm, node_modules):
    env = {**os.environ, "NODE_PATH": str(node_modules)}
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_DIR / "apply_cycle.cjs"),
        rm.target,
        str(PROTO_ROOT),
        str(WKT_DIR),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)

    assert result["ecm_instance"] == "node-host:9000"
    applied = result["applied"]
    assert applied["state"] == "TICKET_STATE_LOCKED"
    assert applied["user"] == "alice"
    # No limit covers userCreator+engineType, so only the ECM's label carries resources.
    assert applied["charged_labels"] == ["emInstance=node-host:9000"]
    assert applied["requested_resource"]["load_instance"]["memory_bytes"] == str(2 * GiB)
    assert result["replayed_same_ticket"] is True

    refusal = result["refusal"]
    assert refusal is not None and refusal["is_resource_exhausted"]
    assert "emInstance=node-host:9000 memory_bytes" in refusal["details"]
    assert refusal["has_status_details"]

    assert result["reported"]["state"] == "TICKET_STATE_USED"
    record = result["label_resource_after_report"]
    assert record["used_resource"]["load_instance"]["memory_bytes"] == str(GiB)
    assert record["locked_resource"]["load_instance"]["memory_bytes"] == "0"
    assert result["released"]["state"] == "TICKET_STATE_RELEASED"

    # The server agrees: nothing left charged, nothing inconsistent.
    state = await label_state(rm, "emInstance=node-host:9000")
    assert state.live_tickets == 0
    assert state.used_resource.load_instance.memory_bytes == 0
    live = await rm.rm.ListTickets(pb.ListTicketsRequest())
    assert list(live.tickets) == []
    await assert_consistent(rm)
