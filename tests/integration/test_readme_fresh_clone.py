"""The README's two set-up commands from a fresh clone, as written: `make run` creates the
clone's `.venv` (the first-run step included) and runs labelrm, whose local agent
launches an EngineConn; `make test` runs the clone's own suite (a small selection).

Slow (the clone installs its virtual environment), so each runs once per CI run (the
embedded-database pass). Run as root, as the README's root variant has it
(`sudo LABELRM_DEV_USERS=<user> make run`), with the EngineConn runtime that
`scripts/install_ec_runtime.sh` installs (the tests' own, LABELRM_EC_VENV)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.serving import free_port
from tests.integration.test_dev_mode import USER, launch_engineconns, stop
from tests.support.env import EC_VENV, ROOT, remove_with_relocated, shared_tmp
from tests.support.waiting import log_tail

pytestmark = [pytest.mark.system, pytest.mark.once]

# The environment of an operator's shell: no virtual environment of this checkout's on
# the PATH, no pytest or make state leaking in.
DROPPED = ("VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PYTEST_ADDOPTS", "PYTHONPATH")


def shell_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED and not k.startswith("PYTEST_")}
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def clone(sudo_users: tuple[str, ...], ec_python: str) -> Iterator[Path]:
    """A fresh clone of this checkout's HEAD, with no `.venv` yet."""
    parent = shared_tmp("lrm-clone-")
    path = parent / "labelrm"
    subprocess.run(
        ["git", "-c", "safe.directory=*", "clone", "--quiet", str(ROOT), str(path)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert not (path / ".venv").exists()
    yield path
    remove_with_relocated(parent)


def test_make_run_from_a_fresh_clone_creates_the_venv_and_runs_labelrm(clone: Path) -> None:
    port, console = free_port(), free_port()
    log = clone.parent / "make-run.log"
    proc = subprocess.Popen(
        ["make", "run", f"LISTEN=127.0.0.1:{port}", f"CONSOLE=127.0.0.1:{console}",
         f"METRICS=127.0.0.1:{free_port()}"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=clone,
        env=shell_env(LABELRM_DEV_USERS=USER, LABELRM_EC_VENV=str(EC_VENV)),
        start_new_session=True,
    )  # fmt: skip
    try:
        # The first run installs the project (minutes on a cold cache) before it serves.
        launch_engineconns(f"127.0.0.1:{port}", log, rounds=1, serving_timeout=900)
        assert (clone / ".venv" / ".installed").exists()
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C on the terminal
        try:
            proc.wait(60)
        finally:
            stop(proc)
    assert "Traceback" not in log.read_text(), log_tail(log)


def test_make_test_runs_in_a_fresh_clone(clone: Path) -> None:
    done = subprocess.run(
        ["make", "test", "PYTEST_ARGS=tests/unit/test_quantity.py -p no:cacheprovider"],
        capture_output=True, text=True, timeout=1200, cwd=clone, env=shell_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-3000:]
    assert (clone / ".venv" / ".installed").exists()
