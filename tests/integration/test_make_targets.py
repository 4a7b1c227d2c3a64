"""The task runner as a newcomer meets it: `make test` says why tests were skipped and how
to run everything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers import ROOT


def test_make_test_lists_skip_reasons_and_how_to_run_everything(tmp_path: Path) -> None:
    suite = tmp_path / "test_sample.py"
    suite.write_text(
        "import pytest\n\n"
        "def test_runs():\n    assert True\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_needs_users(n):\n    pytest.skip('user lrmtest_a missing: run scripts/create_test_users.sh')\n"
    )
    done = subprocess.run(
        ["make", "test", f"PYTEST_ARGS={suite} -p no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # Skips of one reason are summarised in one line, with the reason.
    skipped = [line for line in lines if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and skipped[0].startswith("SKIPPED [2] ")
    assert "run scripts/create_test_users.sh" in skipped[0]
    assert lines[-1].startswith("some tests were skipped") and "make test-setup" in lines[-1]
    assert (
        "test-setup"
        in subprocess.run(
            ["make", "help"], capture_output=True, text=True, timeout=60, cwd=ROOT
        ).stdout
    )
