"""The README's grpcurl, `buf curl` and rmctl examples, run verbatim against a live RM;
its SDK snippet and metrics line against a real `make run`.

Every fenced block preceded by ``<!-- readme-example: NAME -->`` is extracted, in order,
into one bash script (later blocks use variables of earlier ones, as a reader's shell
would). The only change is the address: the README's 127.0.0.1:7100 becomes the test
server's port. Each block must exit 0 and print its key output.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from pathlib import Path

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc

from bench.serving import free_port
from tests.support.env import EC_VENV, ROOT, remove_with_relocated, shared_tmp
from tests.support.rm import assert_consistent
from tests.support.waiting import log_tail, wait_serving, wait_until_sync

README = ROOT / "README.md"
README_TARGET = "127.0.0.1:7100"
_BLOCK = re.compile(r"<!-- readme-example: ([\w-]+) -->\s*\n```bash\n(.*?)\n```", re.DOTALL)
_END = "@@@ readme-example done: "

# What each example must print (in its own output); every marked block needs an entry.
EXPECT = {
    "grpcurl-list": [
        "labelrm.v1.ResourceManagerService",
        "rpc Apply ( .labelrm.v1.ApplyRequest )",
        '"status": "SERVING"',
    ],
    "grpcurl-register": ['"instance": "worker-1:9101"', '"emInstance"'],
    "grpcurl-limit": ['"pattern": "userCreator=*-IDE,engineType=spark-3.2.1"'],
    "grpcurl-apply": ['"state": "TICKET_STATE_LOCKED"'],
    "grpcurl-report-release": [
        '"state": "TICKET_STATE_USED"',
        '"label": "emInstance=worker-1:9101"',
        '"state": "TICKET_STATE_RELEASED"',
    ],
    "grpcurl-check": ['"consistent": true'],
    "buf-curl": [
        "labelrm.v1.AdminService",
        '"status": "SERVING"',
        '"state": "TICKET_STATE_LOCKED"',
        '"state": "TICKET_STATE_RELEASED"',
        '"consistent": true',
    ],
    "rmctl": ["consistent:", "LABEL", "emInstance=worker-1:9101", "TICKET_ID"],
}


def readme_examples() -> list[tuple[str, str]]:
    return _BLOCK.findall(README.read_text())


def test_every_marked_example_has_expectations():
    names = [name for name, _ in readme_examples()]
    assert len(names) == len(set(names)), "example names must be unique"
    assert set(names) == set(EXPECT)


async def test_readme_examples_run_verbatim(rm):
    parts = ["set -euo pipefail"]
    for name, body in readme_examples():
        parts += [body.replace(README_TARGET, rm.target), f"echo '{_END}{name}'"]
    env = {**os.environ, "LABELRM_RM": rm.target}  # rmctl's address when --rm is not given
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        "\n".join(parts),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out_b, err_b = await asyncio.wait_for(proc.communicate(), timeout=120)
    out, err = out_b.decode(), err_b.decode()
    done = re.findall(re.escape(_END) + r"([\w-]+)", out)
    assert proc.returncode == 0, f"failed after {done[-1:] or 'start'}:\n{out[-3000:]}\n{err}"
    assert done == [name for name, _ in readme_examples()]

    outputs = dict(zip(done, re.split(re.escape(_END) + r"[\w-]+\n", out)[:-1], strict=True))
    for name, needles in EXPECT.items():
        for needle in needles:
            assert needle in outputs[name], f"{name}: {needle!r} not in:\n{outputs[name]}"
    await assert_consistent(rm)


# Blocks run against a real `make run` (its local agent, its metrics address): each
# preceded by ``<!-- readme-make-run: NAME -->``, in bash or Python.
_MAKE_RUN_BLOCK = re.compile(
    r"<!-- readme-make-run: ([\w-]+) -->\s*\n```(bash|python)\n(.*?)\n```", re.DOTALL
)
README_METRICS = "127.0.0.1:7190"
MAKE_RUN_EXPECT = {
    "sdk": ["ExecOutput(stream='stdout', text='42", "ExecResult(exit_code=0,"],
    "metrics": ["labelrm_rpc_total{", "labelrm_apply_waiting"],
}


@pytest.mark.once
def test_readme_blocks_run_against_make_run(sudo_users, ec_python):
    """`make run` as the README's root variant has it (LABELRM_DEV_USERS=<user>), then
    its Python snippet, run by that user (it hardcoded `alice`: a traceback for everyone
    else), and its metrics line (it started a second rm-server on `make run`'s data
    directory, refused while `make run` held it; `make run` now serves metrics itself,
    METRICS=...). Only the addresses change: the test's free ports."""
    blocks = {
        name: (lang, body) for name, lang, body in _MAKE_RUN_BLOCK.findall(README.read_text())
    }
    assert set(blocks) == set(MAKE_RUN_EXPECT)
    user = sudo_users[0]
    root = shared_tmp("lrm-readme-run-")
    port, console, metrics = free_port(), free_port(), free_port()
    target = f"127.0.0.1:{port}"
    log = root / "make-run.log"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "SUDO_USER")}
    env.update(LABELRM_DEV_USERS=user, LABELRM_EC_VENV=str(EC_VENV))
    proc = subprocess.Popen(
        ["make", "run", f"LISTEN={target}", f"CONSOLE=127.0.0.1:{console}",
         f"METRICS=127.0.0.1:{metrics}", f"DATA_DIR={root / 'labelrm-data'}"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=ROOT, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_serving(target, 120, log=log)
        wait_local_agent(target, log)
        outputs = {}
        for name, (lang, body) in blocks.items():
            code = body.replace(README_TARGET, target).replace(
                README_METRICS, f"127.0.0.1:{metrics}"
            )
            # The snippet as the EngineConn user, with the labelrm the users can run.
            argv = (
                ["sudo", "-n", "-u", user, "--", ec_python, "-c", code]
                if lang == "python"
                else ["bash", "-euo", "pipefail", "-c", code]
            )
            done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd="/")
            assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}\n{log_tail(log)}"
            outputs[name] = done.stdout
        for name, needles in MAKE_RUN_EXPECT.items():
            for needle in needles:
                assert needle in outputs[name], f"{name}: {needle!r} not in:\n{outputs[name]}"
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C on the terminal
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            said = log.read_text()
            remove_with_relocated(root)
    assert "Traceback" not in said, said[-3000:]


def wait_local_agent(target: str, log: Path) -> None:
    """`make run`'s local agent registered and RUNNING."""
    with grpc.insecure_channel(target) as channel:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)

        def running() -> bool:
            ecms = rm.ListEcms(pb.ListEcmsRequest(), timeout=10).ecms
            return any(
                e.instance == "local-agent" and e.state == pb.ECM_STATE_RUNNING for e in ecms
            )

        wait_until_sync(running, 60, what=lambda: "local-agent RUNNING\n" + log_tail(log))
