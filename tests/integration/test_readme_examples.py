"""The README's grpcurl, `buf curl` and rmctl examples, run verbatim against a live RM.

Every fenced block preceded by ``<!-- readme-example: NAME -->`` is extracted, in order,
into one bash script (later blocks use variables of earlier ones, as a reader's shell
would). The only change is the address: the README's 127.0.0.1:7100 becomes the test
server's port. Each block must exit 0 and print its key output.
"""

from __future__ import annotations

import asyncio
import os
import re

from tests.helpers import ROOT, assert_consistent

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
