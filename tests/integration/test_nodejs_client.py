"""Any language: a Node.js client (@grpc/grpc-js + @grpc/proto-loader, reading the
shipped .proto files) runs register -> apply -> report-used -> release against a live RM.

The npm packages are installed by this test's setup with `npm ci` from the committed
tests/nodejs/package-lock.json into a cache directory ($LABELRM_NODE_CACHE, default
~/.cache/labelrm/nodejs/<hash of the lock file>), reused while the lock file is unchanged.
In CI (CI=true) a missing node/npm or a failed install fails the test; elsewhere it skips.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import pytest
from labelrm.v1 import resource_manager_pb2 as pb

from tests.conftest import ROOT
from tests.helpers import GiB, assert_consistent, label_state

NODE_DIR = ROOT / "tests" / "nodejs"
PROTO_ROOT = ROOT / "protos"
WKT_DIR = Path(str(resources.files("grpc_tools") / "_proto"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"Node.js client test cannot run in CI: {reason}")
    pytest.skip(reason)


def _install(cache_root: Path) -> Path:
    """node_modules for the committed lock file, installed once per lock file version."""
    lock = (NODE_DIR / "package-lock.json").read_bytes()
    target = cache_root / hashlib.sha256(lock).hexdigest()[:16]
    if (target / "node_modules" / "@grpc" / "grpc-js" / "package.json").is_file():
        return target / "node_modules"
    cache_root.mkdir(parents=True, exist_ok=True)
    # Install into a scratch directory and rename: an interrupted install leaves no
    # half-filled cache behind.
    scratch = Path(tempfile.mkdtemp(prefix="install-", dir=cache_root))
    for name in ("package.json", "package-lock.json"):
        shutil.copy(NODE_DIR / name, scratch / name)
    try:
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=scratch,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        output = getattr(exc, "stderr", "") or ""
        _unavailable(f"npm ci failed: {exc}\n{output[-2000:]}")
    try:
        scratch.rename(target)
    except OSError:  # another run installed it meanwhile
        shutil.rmtree(scratch, ignore_errors=True)
    return target / "node_modules"


@pytest.fixture(scope="session")
def node_modules() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        _unavailable("node and npm are not installed")
    default = Path.home() / ".cache" / "labelrm" / "nodejs"
    return _install(Path(os.environ.get("LABELRM_NODE_CACHE") or default))


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
