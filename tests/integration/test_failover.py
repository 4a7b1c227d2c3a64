"""Two rm-server replicas on a real Patroni cluster (deploy/ha): a storm of ticket cycles
with request ids rides out a hard crash of the primary, a graceful switchover, and a
freeze of the primary past the leader key's TTL (each request-grouping mode).

What must hold (docs/operations.md, "High availability"): every Apply a client saw
acknowledged is on the new primary (and every acknowledged Release ended its ticket);
no ticket exists that no client was answered for (a call whose answer was lost in
flight is retried with its request id and gets that ticket); no call gets anything but
a retryable UNAVAILABLE / DEADLINE_EXCEEDED; CheckConsistency is clean afterwards.

Marked `ha`: it runs once per CI run (with the embedded-database pass), since it brings
its own database cluster; it needs Debian's etcd-server and curl (`ha.sh up` installs
the pinned Patroni from PyPI into its own virtualenv when missing).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc as pb_grpc

from bench.failover import (
    RETRY_CODES,
    StormLog,
    audit,
    check_consistency,
    failover_run,
    setup_cluster,
)
from bench.ha_cluster import HA_SCRIPT, HACluster, rm_replicas
from tests.support.env import unavailable
from tests.support.messages import GiB, apply_req, load_instance, register
from tests.support.waiting import wait_until

pytestmark = pytest.mark.ha

STORM_SECONDS = float(os.environ.get("LABELRM_FAILOVER_SECONDS", "20"))
CLIENTS = 8


def _tools_present() -> bool:
    return all(shutil.which(t) for t in ("etcd", "curl"))


@pytest.fixture
def cluster() -> Iterator[HACluster]:
    if not _tools_present():
        unavailable("etcd / curl not installed (apt-get install etcd-server curl)")
    ha = HACluster(synchronous=True)
    try:
        ha.up()
        yield ha
    finally:
        ha.down()


def _assert_nothing_lost(cluster: HACluster, log: StormLog) -> None:
    assert log.errors == [], f"non-retryable answers during the failover: {log.errors[:5]}"
    assert log.cycles > 0
    found = audit(cluster, log)
    assert found.lost_acked == set(), (
        f"acknowledged tickets missing on the new primary: {sorted(found.lost_acked)[:5]}"
    )
    assert found.unacked == set(), (
        f"tickets no client was answered for: {sorted(found.unacked)[:5]}"
    )
    assert found.released_not_ended == set(), (
        f"acknowledged releases whose ticket did not end RELEASED: {sorted(found.released_not_ended)[:5]}"
    )
    assert found.report_undone == set(), (
        f"acknowledged ReportUsed calls the ticket does not show: {sorted(found.report_undone)[:5]}"
    )
    assert log.vanished == set(), (
        f"acknowledged tickets answered NOT_FOUND later: {sorted(log.vanished)[:5]}"
    )


def _up_as_configured(cluster: HACluster) -> None:
    """`ha.sh up` returns once Patroni has named the synchronous standby in etcd, not
    merely once two replicas stream: before that, commits are acknowledged without a
    standby's flush and Patroni may promote any replica, so a crash then can lose what
    the primary acknowledged (an acknowledged ticket then answered NOT_FOUND)."""
    roles = [cluster.role_of(index) for index in (1, 2, 3)]
    assert sorted(map(str, roles)) == ["primary", "replica", "sync"], roles


@pytest.mark.parametrize("fault", ["kill", "switchover"])
async def test_failover_under_load_loses_nothing(
    cluster: HACluster, fault: str, tmp_path: Path
) -> None:
    _up_as_configured(cluster)
    with rm_replicas(cluster.url, 2, tmp_path) as targets:
        await setup_cluster(targets[0])
        old_primary = cluster.primary()
        run = await failover_run(
            cluster, targets, clients=CLIENTS, seconds=STORM_SECONDS, fault=fault
        )
        new_primary = cluster.primary()
        assert new_primary != old_primary
        # In synchronous mode Patroni promotes only the standby it named: the one every
        # acknowledged commit reached.
        assert new_primary == run.sync_standby, (new_primary, run.sync_standby)
        assert run.window is not None, "no Apply was granted after the fault"
        print(
            f"\n{fault}: no Apply granted for {run.window:.1f} s after the fault;"
            f" {run.log.cycles} cycles, {run.log.retries} retried calls"
        )
        _assert_nothing_lost(cluster, run.log)
        for target in targets:  # both replicas reconnected to the new primary
            report = await check_consistency(target)
            assert report.consistent, report


@pytest.mark.parametrize("batch_max", [0, 256], ids=["one-per-transaction", "grouped"])
@pytest.mark.parametrize("fault", ["freeze", "pause"], ids=["past-the-ttl", "within-the-ttl"])
async def test_a_frozen_primary_loses_nothing_and_stalls_nothing(
    cluster: HACluster, fault: str, batch_max: int, tmp_path: Path
) -> None:
    """The primary's PostgreSQL stops answering (SIGSTOP of the postmaster and every
    backend, its Patroni running on), then comes back.

    Past the leader key's TTL ('freeze'), Patroni promotes the synchronous standby: the
    rm-server replicas abandon what hangs on the frozen primary (callers answered
    UNAVAILABLE, retried with their request ids) and fail over, writing on the new
    primary while the old is still frozen; the old primary, thawed, must not take the
    leader key back (Patroni before 3.0.3 did, and rewound the new primary: every write
    it had acknowledged was lost). Within the TTL ('pause'), nobody fails over: the
    replicas ride the freeze out on the same primary, where some of the transactions
    they abandoned committed all the same (their retries get the stored outcomes), and
    write again once it is thawed."""
    with rm_replicas(cluster.url, 2, tmp_path, ("--batch-max", str(batch_max))) as targets:
        await setup_cluster(targets[0])
        old_primary = cluster.primary()
        run = await failover_run(
            cluster, targets, clients=CLIENTS, seconds=STORM_SECONDS, fault=fault
        )
        print(
            f"\n{fault} (batch_max {batch_max}): promoted {run.promoted_after} s into it,"
            f" writes through both replicas {run.resumed_after} s after the promotion (freeze)"
            f" or the thaw (pause), no Apply granted for {run.window} s; frozen"
            f" {run.frozen_for} s; {run.log.cycles} cycles, {run.log.retries} retried calls"
        )
        _assert_nothing_lost(cluster, run.log)
        if fault == "freeze":
            assert cluster.primary() == run.sync_standby != old_primary
        else:
            assert cluster.primary() == old_primary
        assert run.resumed_after is not None, (
            "the rm-server replicas did not both grant an Apply within 10 s of the"
            f" {'promotion' if fault == 'freeze' else 'thaw'}; their logs' warnings:\n"
            + _warnings(tmp_path)
        )
        for target in targets:
            report = await check_consistency(target)
            assert report.consistent, report


def _warnings(log_dir: Path, last: int = 15) -> str:
    """The last warnings and errors of each rm-server log in `log_dir`."""
    out = []
    for log in sorted(log_dir.glob("rm-*.log")):
        lines = [ln[:300] for ln in log.read_text().splitlines() if "level=INFO" not in ln]
        out.append(f"{log.name}:\n" + "\n".join(lines[-last:]))
    return "\n".join(out)


async def test_a_waiting_apply_is_woken_after_a_switchover(
    cluster: HACluster, tmp_path: Path
) -> None:
    """A waiter's LISTEN connection dies with the old primary; the notifier subscribes
    again on the new one, so a release there (through the other replica) still wakes it."""
    with rm_replicas(cluster.url, 2, tmp_path) as (first, second):
        async with (
            grpc.aio.insecure_channel(first) as one,
            grpc.aio.insecure_channel(second) as two,
        ):
            rm_one = pb_grpc.ResourceManagerServiceStub(one)
            rm_two = pb_grpc.ResourceManagerServiceStub(two)
            await rm_one.RegisterEcm(register("wake:1", load_instance(GiB, 1000, 1)), timeout=30)
            holder = (
                await rm_one.Apply(
                    apply_req("emInstance=wake:1", load_instance(1, 1, 1)), timeout=30
                )
            ).ticket
            waiting = asyncio.ensure_future(
                rm_one.Apply(
                    apply_req("emInstance=wake:1", load_instance(1, 1, 1), wait=120), timeout=150
                )
            )
            await wait_until(
                lambda: asyncio.to_thread(
                    lambda: (
                        waiting.done()
                        or cluster.query("SELECT count(*) FROM apply_waiter")[0][0] > 0
                    )
                ),
                30,
                what="the Apply is waiting",
                interval=0.1,
            )
            if waiting.done():
                pytest.fail(f"the waiting Apply ended before the switchover: {waiting.result()}")
            candidate = await asyncio.to_thread(cluster.standby_to_promote)
            await asyncio.to_thread(cluster.switchover, candidate)
            if waiting.done():  # it must still wait: the failover is not its answer
                pytest.fail(f"the waiting Apply ended at the switchover: {waiting.exception()!r}")
            release = pb.ReleaseRequest(ticket_id=holder.ticket_id, request_id="wake-release")

            async def released() -> bool:
                try:
                    await rm_two.Release(release, timeout=5)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in RETRY_CODES:
                        raise
                    return False
                return True

            await wait_until(released, 60, what="the Release through the failover", interval=0.2)
            granted = (await asyncio.wait_for(waiting, 60)).ticket
            assert granted.state == pb.TICKET_STATE_LOCKED
            report = await check_consistency(second)
            assert report.consistent, report


def test_down_signals_no_process_a_stale_pid_file_names(tmp_path: Path) -> None:
    """`ha.sh down` after the cluster's processes are gone (a reboot, a kill -9) finds
    pid files whose numbers may now be anyone's: it signals only a process whose command
    line still names its state directory."""
    state = tmp_path / "cluster"
    state.mkdir()
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        for name in ("pg1", "pg2", "pg3", "etcd"):
            (state / f"{name}.pid").write_text(f"{bystander.pid}\n")
        done = subprocess.run(
            ["bash", str(HA_SCRIPT), "down"],
            env={**os.environ, "HA_DIR": str(state)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert bystander.poll() is None, "ha.sh down killed a process that was not its own"
        assert not state.exists()
    finally:
        bystander.kill()
        bystander.wait()
