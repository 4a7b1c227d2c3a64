"""The local HA PostgreSQL of deploy/ha (etcd + 3 Patroni members) under a test's or a
benchmark's control, and rm-server processes on it: faults (kill, switchover, freeze),
roles from Patroni's REST API, queries on the primary. Used by bench/failover.py and
tests/integration/test_failover.py."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.common import ROOT
from bench.serving import free_port, wait_serving

HA_SCRIPT = ROOT / "deploy" / "ha" / "ha.sh"
# The pinned Patroni's virtualenv (deploy/ha/install_patroni.sh), as ha.sh finds it.
PATRONI_VENV = Path(os.environ.get("HA_PATRONI_VENV", "/opt/labelrm/patroni-venv"))


def _free_block(count: int) -> int:
    """A base port b with b+1 .. b+count free on loopback (picked at random, checked)."""
    for _ in range(200):
        base = random.randint(20000, 40000)
        try:
            for offset in range(1, count + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of ports on loopback")


@dataclass
class HACluster:
    """The deploy/ha cluster in a private state directory and private ports."""

    synchronous: bool = True
    ttl: int = 20
    loop_wait: int = 2
    retry_timeout: int = 4
    state: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="labelrm-ha-")))
    pg_base: int = field(default_factory=lambda: _free_block(3))
    rest_base: int = field(default_factory=lambda: _free_block(3))
    etcd_port: int = field(default_factory=lambda: _free_block(1) + 1)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HA_DIR": str(self.state / "cluster"),
            "HA_PG_BASE_PORT": str(self.pg_base),
            "HA_REST_BASE_PORT": str(self.rest_base),
            "HA_ETCD_PORT": str(self.etcd_port),
            "HA_SYNC": "1" if self.synchronous else "0",
            "HA_TTL": str(self.ttl),
            "HA_LOOP_WAIT": str(self.loop_wait),
            "HA_RETRY_TIMEOUT": str(self.retry_timeout),
        }

    def script(self, command: str, timeout: float = 240) -> str:
        proc = subprocess.run(
            ["bash", str(HA_SCRIPT), command],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ha.sh {command} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout.strip()

    def up(self) -> None:
        # The members run as `postgres` when we are root: they must reach the directory.
        self.state.chmod(0o755)
        self.script("up")

    def down(self) -> None:
        with contextlib.suppress(Exception):
            self.script("down", timeout=90)
        shutil.rmtree(self.state, ignore_errors=True)

    @property
    def url(self) -> str:
        return self.script("url")

    def member(self, name: str) -> Path:
        return self.state / "cluster" / name

    def rest_port(self, index: int) -> int:
        return self.rest_base + index

    def role_of(self, index: int) -> str | None:
        """'primary', 'sync' (the synchronous standby), 'replica' or None (down), from
        Patroni's REST health endpoints."""
        for role in ("primary", "sync", "replica"):
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.rest_port(index)}/{role}", timeout=1
                ) as resp:
                    if resp.status == 200:
                        return role
            except OSError:
                continue
        return None

    def primary(self) -> int:
        for index in (1, 2, 3):
            if self.role_of(index) == "primary":
                return index
        raise RuntimeError("no primary")

    def standby_to_promote(self, timeout: float = 60) -> int:
        """The member a switchover may promote: the synchronous standby in synchronous
        mode (Patroni promotes no other), any replica otherwise; waits for one, since
        Patroni names the synchronous standby a loop or two after the replicas stream."""
        wanted = "sync" if self.synchronous else "replica"
        deadline = time.monotonic() + timeout
        while True:
            for index in (1, 2, 3):
                if self.role_of(index) == wanted:
                    return index
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {wanted} standby after {timeout}s")
            time.sleep(0.2)

    def kill_member(self, index: int) -> None:
        """kill -9 a member's Patroni (its whole process group) and its postmaster."""
        name = f"pg{index}"
        root = self.state / "cluster"
        postmaster_pid = root / name / "data" / "postmaster.pid"
        pm = int(postmaster_pid.read_text().split()[0]) if postmaster_pid.exists() else None
        group = int((root / f"{name}.pid").read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        if pm is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pm, signal.SIGKILL)

    def postgres_pids(self, index: int) -> list[int]:
        """A member's postmaster and every process it forked (its backends, walsender,
        checkpointer...), the postmaster first; [] when it is not running."""
        pid_file = self.member(f"pg{index}") / "data" / "postmaster.pid"
        try:
            postmaster = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        return [postmaster, *_children_of(postmaster)]

    def freeze_member(self, index: int) -> list[int]:
        """SIGSTOP a member's postmaster and then each of its processes by PID (a VM
        pause, an I/O stall: the sockets stay open, nothing answers); its Patroni goes
        on running. Returns the PIDs stopped, for `thaw`. The postmaster first, so that
        it forks nothing new while its children are stopped."""
        stopped: list[int] = []
        while True:
            fresh = [pid for pid in self.postgres_pids(index) if pid not in stopped]
            if not fresh:
                return stopped
            for pid in fresh:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

    @staticmethod
    def thaw(pids: list[int]) -> None:
        """SIGCONT what `freeze_member` stopped (the children before the postmaster)."""
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def wait_for_new_primary(self, old: int, timeout: float) -> int:
        """The member other than `old` that Patroni promotes, once its REST says so."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for index in (1, 2, 3):
                if index != old and self.role_of(index) == "primary":
                    return index
            time.sleep(0.2)
        raise TimeoutError(f"no member but pg{old} became primary within {timeout}s")

    def switchover(self, candidate: int) -> None:
        subprocess.run(
            [
                str(PATRONI_VENV / "bin" / "patronictl"),
                "-c",
                str(self.state / "cluster" / "pg1.yml"),
                "switchover",
                "--force",
                "--candidate",
                f"pg{candidate}",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        # patronictl returns when the switchover is scheduled; wait for the new primary.
        deadline = time.monotonic() + 60
        while self.role_of(candidate) != "primary":
            if time.monotonic() > deadline:
                raise RuntimeError(f"pg{candidate} did not become primary after the switchover")
            time.sleep(0.2)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql).fetchall()


def _children_of(parent: int) -> list[int]:
    """The PIDs whose parent is `parent` (from /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


@contextlib.contextmanager
def rm_servers(server_args: list[list[str]], log_dir: Path) -> Iterator[list[str]]:
    """One rm-server process per entry of `server_args` (its arguments after --listen);
    yields their targets once all serve, and stops them on the way out."""
    procs: list[subprocess.Popen[bytes]] = []
    targets = []
    try:
        for i, extra in enumerate(server_args):
            target = f"127.0.0.1:{free_port()}"
            with (log_dir / f"rm-{i}.log").open("ab") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "rm_server", "--listen", target, *extra],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,
                    )
                )
            targets.append(target)
        for target, proc in zip(targets, procs, strict=True):
            wait_serving(target, 60, proc)
        yield targets
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def rm_replicas(
    url: str, count: int, log_dir: Path, extra: tuple[str, ...] = ()
) -> contextlib.AbstractContextManager[list[str]]:
    """`count` rm-server replicas on the database at `url` (`extra`: more arguments).
    The storms' ECM has no agent beating for it: it must not be judged LOST (30 s of
    silence by default) halfway through a storm."""
    args = ["--database-url", url, "--ecm-expiry", "3600", *extra]
    return rm_servers([args] * count, log_dir)
