"""Two rm-server replicas on a real Patroni cluster (deploy/ha): a storm of ticket cycles
with request ids rides out a hard crash of the primary and a graceful switchover.

What must hold (docs/operations.md, "High availability"): every Apply a client saw
acknowledged is on the new primary (and every acknowledged Release ended its ticket);
no ticket exists that no client was answered for (a call whose answer was lost in
flight is retried with its request id and gets that ticket); no call gets anything but
a retryable UNAVAILABLE / DEADLINE_EXCEEDED; CheckConsistency is clean afterwards.

Marked `ha`: it runs once per CI run (with the embedded-database pass), since it brings
its own database cluster; it needs Debian's patroni, etcd-server and python3-etcd.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc as pb_grpc

from bench.failover import (
    RETRY_CODES,
    HACluster,
    StormLog,
    audit,
    check_consistency,
    failover_run,
    rm_replicas,
    setup_cluster,
)
from tests.helpers import GiB, apply_req, load_instance, register, unavailable, wait_until

pytestmark = pytest.mark.ha

STORM_SECONDS = float(os.environ.get("LABELRM_FAILOVER_SECONDS", "20"))
CLIENTS = 8


def _tools_present() -> bool:
    return all(shutil.which(t) for t in ("patroni", "patronictl", "etcd", "curl"))


@pytest.fixture
def cluster() -> Iterator[HACluster]:
    if not _tools_present():
        unavailable(
            "patroni / etcd not installed (apt-get install patroni etcd-server python3-etcd)"
        )
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
    assert found.released_not_ended == set(), "acknowledged releases whose ticket is still live"


def test_the_cluster_is_up_with_its_synchronous_standby_named(cluster: HACluster) -> None:
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
