"""labelrm on a Patroni cluster: what a failover costs, and what it may lose.

    python -m bench.failover [--seconds 40] [--clients 8] [--skip-async]

Starts the local HA PostgreSQL of deploy/ha (etcd + 3 Patroni members), two rm-server
replicas on its multi-host URL, and a storm of Apply -> ReportUsed -> Release cycles
with request ids (a call that fails UNAVAILABLE or DEADLINE_EXCEEDED is retried with the
same id, as the SDK does). It measures:

- the unavailability window after a hard crash (kill -9 of the primary's Patroni and
  postmaster) and after a graceful `patronictl switchover`: from the kill (or the
  switchover command) to the first Apply granted after it;
- the apply-cycle throughput on the HA cluster against one embedded PostgreSQL;
- with asynchronous replication, how many acknowledged tickets a hard crash loses.

The same cluster control and storm drive tests/integration/test_failover.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
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
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_pb2
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc as pb_grpc

from bench.common import ROOT, emit, table

HA_SCRIPT = ROOT / "deploy" / "ha" / "ha.sh"
# The pinned Patroni's virtualenv (deploy/ha/install_patroni.sh), as ha.sh finds it.
PATRONI_VENV = Path(os.environ.get("HA_PATRONI_VENV", "/opt/labelrm/patroni-venv"))
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
GiB = 1024**3


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
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                target = f"127.0.0.1:{s.getsockname()[1]}"
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
            _wait_serving(target, proc, 60)
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
    """`count` rm-server replicas on the database at `url` (`extra`: more arguments)."""
    return rm_servers([["--database-url", url, *extra]] * count, log_dir)


def _wait_serving(target: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"rm-server {target} exited with {proc.returncode}")
            with contextlib.suppress(grpc.RpcError):
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.1)
    raise TimeoutError(f"rm-server {target} not serving after {timeout}s")


ECM = "ha:1"
LABELS = [resource_pb2.Label(key="emInstance", value=ECM)]


def _resource(instances: int) -> resource_pb2.Resource:
    return resource_pb2.Resource(
        load_instance=resource_pb2.LoadInstanceResource(
            memory_bytes=instances * GiB, cpu_millis=instances * 1000, instances=instances
        )
    )


@dataclass
class StormLog:
    """What the storm's clients were told: the ground truth the database is checked against."""

    acked_apply: set[str] = field(default_factory=set)
    acked_release: set[str] = field(default_factory=set)
    # when each granted Apply was answered (monotonic)
    granted_at: list[float] = field(default_factory=list)
    # per rm-server target: when it last granted an Apply (monotonic)
    last_grant: dict[str, float] = field(default_factory=dict)
    cycles: int = 0
    retries: int = 0
    errors: list[str] = field(default_factory=list)  # any status other than a retryable one
    vanished: set[str] = field(default_factory=set)  # acked, then NOT_FOUND on report/release


async def setup_cluster(target: str) -> None:
    """Register the one ECM every storm cycle applies on (idempotent)."""
    async with grpc.aio.insecure_channel(target) as channel:
        rm = pb_grpc.ResourceManagerServiceStub(channel)
        await rm.RegisterEcm(
            pb.RegisterEcmRequest(
                instance=ECM, total_resource=_resource(100_000), request_id=f"reg-{ECM}"
            ),
            timeout=30,
        )


async def _call(
    log: StormLog, method: Any, request: Any, give_up_at: float, target: str = ""
) -> Any:
    """One call, retried with the same request (and so the same request id) while the
    answer is UNAVAILABLE or DEADLINE_EXCEEDED, until `give_up_at`."""
    while True:
        try:
            response = await method(request, timeout=5)
            if isinstance(request, pb.ApplyRequest):
                now = time.monotonic()
                log.granted_at.append(now)
                log.last_grant[target] = now
            return response
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRY_CODES:
                log.errors.append(f"{exc.code().name}: {exc.details()}")
                raise
            if time.monotonic() > give_up_at:
                log.errors.append(f"gave up after {exc.code().name}: {exc.details()}")
                raise
            log.retries += 1
            await asyncio.sleep(0.1)


async def storm(
    targets: list[str],
    clients: int,
    seconds: float,
    log: StormLog,
    grace: float = 90.0,
    stop: asyncio.Event | None = None,
) -> None:
    """`clients` workers cycling Apply -> ReportUsed -> Release for `seconds` (or until
    `stop` is set); a cycle that started finishes (its calls retried up to `grace`
    seconds after it started, or after the end if that is later)."""
    end = time.monotonic() + seconds
    channels = [grpc.aio.insecure_channel(t) for t in targets]
    try:
        stubs = [pb_grpc.ResourceManagerServiceStub(c) for c in channels]

        async def worker(n: int) -> None:
            rm = stubs[n % len(stubs)]
            target = targets[n % len(targets)]
            while time.monotonic() < end and not (stop is not None and stop.is_set()):
                give_up = (end if stop is None else time.monotonic()) + grace
                base = uuid.uuid4().hex
                ticket = (
                    await _call(
                        log,
                        rm.Apply,
                        pb.ApplyRequest(
                            labels=LABELS, resource=_resource(1), request_id=f"{base}-a"
                        ),
                        give_up,
                        target,
                    )
                ).ticket
                log.acked_apply.add(ticket.ticket_id)
                try:
                    await _call(
                        log,
                        rm.ReportUsed,
                        pb.ReportUsedRequest(
                            ticket_id=ticket.ticket_id,
                            used_resource=_resource(1),
                            request_id=f"{base}-u",
                        ),
                        give_up,
                    )
                    await _call(
                        log,
                        rm.Release,
                        pb.ReleaseRequest(ticket_id=ticket.ticket_id, request_id=f"{base}-r"),
                        give_up,
                    )
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    # An acknowledged ticket the database no longer has (asynchronous
                    # replication lost it with the old primary): counted, the storm goes on.
                    log.vanished.add(ticket.ticket_id)
                    continue
                log.acked_release.add(ticket.ticket_id)
                log.cycles += 1

        await asyncio.gather(*(worker(n) for n in range(clients)))
    finally:
        for c in channels:
            await c.close()


async def check_consistency(target: str) -> admin_pb2.CheckConsistencyResponse:
    async with grpc.aio.insecure_channel(target) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        return await admin.CheckConsistency(admin_pb2.CheckConsistencyRequest(), timeout=30)


@dataclass(frozen=True)
class Audit:
    """The database after the storm, against what the clients were told."""

    lost_acked: set[str]  # acknowledged by the RM, absent from the database
    unacked: set[str]  # in the database, never acknowledged to any client
    released_not_ended: set[str]  # release acknowledged, ticket still live


def audit(cluster: HACluster, log: StormLog) -> Audit:
    live = {row[0] for row in cluster.query("SELECT ticket_id FROM ticket")}
    ended = {row[0] for row in cluster.query("SELECT ticket_id FROM ticket_history")}
    present = live | ended
    return Audit(
        lost_acked=log.acked_apply - present,
        unacked=present - log.acked_apply,
        released_not_ended=log.acked_release & live,
    )


def unavailable_for(log: StormLog, moment: float) -> float | None:
    """The unavailability window a fault at `moment` caused: the longest time, from the
    fault on, in which no Apply was granted (with clients cycling all the while, grants
    otherwise follow each other within milliseconds). None if nothing was granted after."""
    after = sorted(t for t in log.granted_at if t > moment)
    if not after:
        return None
    points = [moment, *after]
    return max(b - a for a, b in itertools.pairwise(points))


@dataclass(frozen=True)
class FailoverRun:
    """What a storm with one fault showed."""

    log: StormLog
    window: float | None  # unavailable_for the fault's moment
    sync_standby: int | None  # the synchronous standby Patroni named before the fault
    # freeze only: seconds from the freeze to the new primary's promotion, and from the
    # promotion until every rm-server had granted an Apply on it (None: not within the
    # bound, with the old primary still frozen); how long the freeze lasted
    promoted_after: float | None = None
    resumed_after: float | None = None
    frozen_for: float | None = None


FAULTS = ("kill", "switchover", "freeze")


async def failover_run(
    cluster: HACluster,
    targets: list[str],
    *,
    clients: int,
    seconds: float,
    fault: str,
    fault_after: float = 4.0,
    resume_bound: float = 10.0,
    after_thaw: float = 6.0,
) -> FailoverRun:
    """A storm with one fault mid-way (FAULTS). In synchronous mode the fault waits for
    Patroni to name a synchronous standby: only while one is named is every acknowledged
    commit on a standby that may be promoted (before, or while Patroni names another,
    commits are acknowledged without one).

    'freeze' stops the primary's PostgreSQL (`freeze_member`) until Patroni has promoted
    another member and every rm-server has granted an Apply on it (waiting at most
    `resume_bound` seconds after the promotion), and for at least the leader key's TTL
    plus a few seconds; then it thaws the old primary, and the storm goes on for
    `after_thaw` seconds over its return (it must come back as a replica, losing nothing
    the new primary acknowledged). The storm lasts until then, whatever `seconds` says."""
    log = StormLog()
    stop = asyncio.Event() if fault == "freeze" else None
    task = asyncio.create_task(storm(targets, clients, seconds, log, stop=stop))
    await asyncio.sleep(fault_after)
    if task.done():
        await task
    old = cluster.primary()
    standby = await asyncio.to_thread(cluster.standby_to_promote)
    moment = time.monotonic()
    timings: dict[str, float | None] = {}
    if fault == "kill":
        cluster.kill_member(old)
    elif fault == "switchover":
        await asyncio.to_thread(cluster.switchover, standby)
    else:
        assert stop is not None
        try:
            timings = await _freeze_until_failed_over(cluster, old, targets, log, resume_bound)
            await asyncio.sleep(after_thaw)
        finally:
            stop.set()
    await task
    return FailoverRun(
        log,
        unavailable_for(log, moment),
        standby if cluster.synchronous else None,
        **timings,
    )


async def _freeze_until_failed_over(
    cluster: HACluster, old: int, targets: list[str], log: StormLog, resume_bound: float
) -> dict[str, float | None]:
    """Freeze member `old` (the primary) and thaw it once failed over (failover_run)."""
    pids = cluster.freeze_member(old)
    moment = time.monotonic()
    resumed_after: float | None = None
    try:
        await asyncio.to_thread(cluster.wait_for_new_primary, old, 3 * cluster.ttl + 30)
        promoted = time.monotonic()
        while time.monotonic() < promoted + resume_bound:
            if all(log.last_grant.get(t, 0.0) > promoted for t in targets):
                resumed_after = time.monotonic() - promoted
                break
            await asyncio.sleep(0.05)
        # Longer than the leader key's TTL, so that the old primary's lease is gone.
        await asyncio.sleep(max(0.0, moment + cluster.ttl + 5 - time.monotonic()))
    finally:
        cluster.thaw(pids)
    return {
        "promoted_after": promoted - moment,
        "resumed_after": resumed_after,
        "frozen_for": time.monotonic() - moment,
    }


async def cycles_per_second(targets: list[str], clients: int, seconds: float) -> float:
    log = StormLog()
    t0 = time.monotonic()
    await storm(targets, clients, seconds, log)
    return log.cycles / (time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--skip-async", action="store_true")
    parser.add_argument("--quick", action="store_true", help="short windows (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 30.0
    rows = []
    result: dict[str, Any] = {}

    def run_on(cluster: HACluster, fault: str) -> tuple[StormLog, float | None, Audit]:
        with tempfile.TemporaryDirectory() as logs, rm_replicas(cluster.url, 2, Path(logs)) as t:
            asyncio.run(setup_cluster(t[0]))
            run = asyncio.run(
                failover_run(cluster, t, clients=args.clients, seconds=args.seconds, fault=fault)
            )
        return run.log, run.window, audit(cluster, run.log)

    for synchronous in (True, False) if not args.skip_async else (True,):
        mode = "sync" if synchronous else "async"
        for fault in ("kill", "switchover") if synchronous else ("kill",):
            cluster = HACluster(synchronous=synchronous)
            try:
                cluster.up()
                log, window, found = run_on(cluster, fault)
            finally:
                cluster.down()
            key = f"{mode}_{fault}"
            result[key] = {
                "window_s": window,
                "cycles": log.cycles,
                "retries": log.retries,
                "lost_acked": len(found.lost_acked),
                "vanished_mid_cycle": len(log.vanished),
                "unacked": len(found.unacked),
                "errors": len(log.errors),
            }
            rows.append(
                [
                    mode,
                    fault,
                    f"{window:.1f} s" if window is not None else "never",
                    str(log.cycles),
                    str(len(found.lost_acked)),
                    str(len(log.vanished)),
                    str(len(found.unacked)),
                    str(len(log.errors)),
                ]
            )
            print(f"{mode} {fault}: {result[key]}", flush=True)
    # Throughput: the same storm without faults, HA (sync) against one embedded server.
    cluster = HACluster(synchronous=True)
    try:
        cluster.up()
        with tempfile.TemporaryDirectory() as logs, rm_replicas(cluster.url, 1, Path(logs)) as t:
            asyncio.run(setup_cluster(t[0]))
            ha_rate = asyncio.run(cycles_per_second(t, args.clients, 10))
    finally:
        cluster.down()
    single_rate = _single_server_rate(args.clients)
    result["throughput"] = {
        "ha_sync": ha_rate,
        "single": single_rate,
        "ratio": ha_rate / single_rate,
    }
    result["patroni"] = {
        "ttl": cluster.ttl,
        "loop_wait": cluster.loop_wait,
        "retry_timeout": cluster.retry_timeout,
    }
    print(
        table(
            [
                "replication",
                "fault",
                "unavailable",
                "cycles",
                "acked lost",
                "vanished",
                "unacked",
                "errors",
            ],
            rows,
        )
    )
    print(
        f"\napply cycles/s, {args.clients} clients: HA (sync) {ha_rate:.1f}, single embedded "
        f"{single_rate:.1f}, ratio {ha_rate / single_rate:.2f}"
    )
    print(
        f"Patroni: ttl {cluster.ttl}, loop_wait {cluster.loop_wait}, retry_timeout {cluster.retry_timeout}"
    )
    emit("failover", "", result)
    return 0


def _single_server_rate(clients: int) -> float:
    """The same storm against one rm-server on its embedded PostgreSQL."""
    with tempfile.TemporaryDirectory() as tmp:
        # As root the embedded database runs as its own user, which must reach the directory.
        Path(tmp).chmod(0o755)
        with rm_servers([["--data-dir", f"{tmp}/data"]], Path(tmp)) as targets:
            asyncio.run(setup_cluster(targets[0]))
            return asyncio.run(cycles_per_second(targets, clients, 10))


if __name__ == "__main__":
    raise SystemExit(main())
