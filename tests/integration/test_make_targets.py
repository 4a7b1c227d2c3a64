"""The task runner as a newcomer meets it: `make test` says why tests were skipped and how
to run everything."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.env import ROOT
from tests.support.waiting import wait_until_sync

# `make test` itself, not the test database: once per CI run.
pytestmark = pytest.mark.once


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


def test_an_interrupted_make_test_leaves_no_database_running(tmp_path: Path) -> None:
    """`make test` killed in the middle, so that no teardown runs (a closed terminal, an
    out-of-memory kill, a second Ctrl-C while workers tear down): the session's embedded
    PostgreSQL, which runs detached, is stopped and its directory removed all the same."""
    mark = tmp_path / "database"
    suite = tmp_path / "test_holds.py"
    suite.write_text(
        "import os, pathlib, time\n\n"
        "def test_holds_the_database(database_url):\n"
        "    pathlib.Path(os.environ['LRM_MARK']).write_text(database_url)\n"
        "    time.sleep(600)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    env.pop("LABELRM_TEST_DATABASE_URL", None)
    env["LRM_MARK"] = str(mark)
    env["PYTHONPATH"] = str(ROOT)  # the sample, outside the tree, loads its fixtures
    proc = subprocess.Popen(
        ["make", "test", "TEST_WORKERS=2",
         f"PYTEST_ARGS=-p tests.fixtures.database {suite} -p no:cacheprovider"],
        cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until_sync(mark.exists, 120, what="the test holding the database")
        pgdata = Path(str(conninfo_to_dict(mark.read_text())["host"]))
        postmaster = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        assert psutil.pid_exists(postmaster)
        os.killpg(proc.pid, signal.SIGKILL)  # the harshest end: no teardown runs at all
        proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        wait_until_sync(lambda: not psutil.pid_exists(postmaster), 60, what="postgres stopped")
        wait_until_sync(lambda: not pgdata.exists(), 60, what="its directory removed")
    finally:  # should the check fail, it leaves nothing behind either
        if psutil.pid_exists(postmaster):
            os.kill(postmaster, signal.SIGQUIT)
