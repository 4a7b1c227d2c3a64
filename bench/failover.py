"""labelrm on a Patroni cluster: what a failover costs, and what it may lose.

    python -m bench.failover [--seconds 40] [--clients 8] [--faults kill,switchover,freeze]
        [--batch-max 0,256] [--repeat N] [--ttl 20 --loop-wait 2 --retry-timeout 4]
        [--skip-async] [--skip-throughput]

Starts the local HA PostgreSQL of deploy/ha (etcd + 3 Patroni members), two rm-server
replicas on its multi-host URL, and a storm of Apply -> ReportUsed -> Release cycles
with request ids (a call that fails UNAVAILABLE or DEADLINE_EXCEEDED is retried with the
same id, as the SDK does). It measures:

- the unavailability window after a hard crash (kill -9 of the primary's Patroni and
  postmaster), a graceful `patronictl switchover` and a freeze (SIGSTOP of the primary's
  postmaster and every backend until another member is promoted, then SIGCONT): from
  the fault to the first Apply granted after it (the longest gap from the fault on);
  for a freeze also when the new primary was promoted, and how long after that both
  rm-server replicas granted an Apply on it (the old primary still frozen);
- what each fault lost: acknowledged tickets missing, acknowledged releases undone,
  acknowledged tickets answered NOT_FOUND later, tickets nobody was answered for;
- the apply-cycle throughput on the HA cluster against one embedded PostgreSQL;
- with asynchronous replication, how many acknowledged tickets a hard crash loses.

The same cluster control and storm drive tests/integration/test_failover.py.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_pb2
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc as pb_grpc

from bench.common import emit, table
from bench.ha_cluster import HACluster, rm_replicas, rm_servers

RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
GiB = 1024**3


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
    acked_report: set[str] = field(default_factory=set)
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
    """`clients` workers cycling Apply -> ReportUsed -> Release for `seconds`, or, given
    `stop`, until it is set; a cycle that started finishes (its calls retried up to
    `grace` seconds after the end, or after the cycle started when `stop` ends it)."""
    # With `stop`, the storm runs until it is set, however long the fault takes.
    end = time.monotonic() + seconds if stop is None else math.inf
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
                    log.acked_report.add(ticket.ticket_id)
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
    released_not_ended: set[str]  # release acknowledged, ticket still live or not RELEASED
    report_undone: set[str]  # ReportUsed acknowledged, the ticket shows none


def audit(cluster: HACluster, log: StormLog) -> Audit:
    live = dict(cluster.query("SELECT ticket_id, state FROM ticket"))
    ended = {
        row[0]: (row[1], row[2])
        for row in cluster.query(
            "SELECT ticket_id, final_state, used IS NOT NULL FROM ticket_history"
        )
    }
    present = set(live) | set(ended)
    reported = {t for t, state in live.items() if state == "USED"}
    reported |= {t for t, (_, used) in ended.items() if used}
    released = {t for t, (state, _) in ended.items() if state == "RELEASED"}
    return Audit(
        lost_acked=log.acked_apply - present,
        unacked=present - log.acked_apply,
        released_not_ended=log.acked_release - released - (log.acked_release - present),
        report_undone=(log.acked_report & present) - reported,
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
    # freeze: seconds from the freeze to the new primary's promotion, and from the
    # promotion until every rm-server had granted an Apply on it (None: not within the
    # bound, with the old primary still frozen); pause: from the thaw until every
    # rm-server had granted an Apply (None: not within the bound); how long either lasted
    promoted_after: float | None = None
    resumed_after: float | None = None
    frozen_for: float | None = None


FAULTS = ("kill", "switchover", "freeze", "pause")


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
    the new primary acknowledged). The storm lasts until then, whatever `seconds` says.

    'pause' freezes the primary the same way for half the TTL (no failover: Patroni
    keeps it), thaws it, and waits at most `resume_bound` seconds for every rm-server to
    grant an Apply again; the storm goes on for `after_thaw` seconds after the thaw."""
    log = StormLog()
    stop = asyncio.Event() if fault in ("freeze", "pause") else None
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
        frozen = _freeze_until_failed_over if fault == "freeze" else _pause
        try:
            timings = await frozen(cluster, old, targets, log, resume_bound)
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
        resumed_after = await _all_granted_after(promoted, targets, log, resume_bound)
        # Longer than the leader key's TTL, so that the old primary's lease is gone.
        await asyncio.sleep(max(0.0, moment + cluster.ttl + 5 - time.monotonic()))
    finally:
        cluster.thaw(pids)
    return {
        "promoted_after": promoted - moment,
        "resumed_after": resumed_after,
        "frozen_for": time.monotonic() - moment,
    }


async def _pause(
    cluster: HACluster, old: int, targets: list[str], log: StormLog, resume_bound: float
) -> dict[str, float | None]:
    """Freeze member `old` (the primary) for half the TTL, then thaw it (failover_run)."""
    pids = cluster.freeze_member(old)
    moment = time.monotonic()
    try:
        await asyncio.sleep(cluster.ttl / 2)
    finally:
        cluster.thaw(pids)
    thawed = time.monotonic()
    return {
        "resumed_after": await _all_granted_after(thawed, targets, log, resume_bound),
        "frozen_for": thawed - moment,
    }


async def _all_granted_after(
    moment: float, targets: list[str], log: StormLog, bound: float
) -> float | None:
    """Seconds from `moment` until every target granted an Apply after it (polled),
    or None if that took longer than `bound`."""
    while time.monotonic() < moment + bound:
        if all(log.last_grant.get(t, 0.0) > moment for t in targets):
            return time.monotonic() - moment
        await asyncio.sleep(0.05)
    return None


async def cycles_per_second(targets: list[str], clients: int, seconds: float) -> float:
    log = StormLog()
    t0 = time.monotonic()
    await storm(targets, clients, seconds, log)
    return log.cycles / (time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--faults", default=",".join(FAULTS), help="of " + ", ".join(FAULTS))
    parser.add_argument(
        "--batch-max", default="256", help="rm-server --batch-max values, comma-separated"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each combination")
    parser.add_argument("--ttl", type=int, default=HACluster.ttl)
    parser.add_argument("--loop-wait", type=int, default=HACluster.loop_wait)
    parser.add_argument("--retry-timeout", type=int, default=HACluster.retry_timeout)
    parser.add_argument("--skip-async", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--quick", action="store_true", help="short windows (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 30.0
    timing = {"ttl": args.ttl, "loop_wait": args.loop_wait, "retry_timeout": args.retry_timeout}
    rows: list[list[str]] = []
    result: dict[str, Any] = {"patroni": timing, "runs": []}
    combos = [
        (True, fault, int(batch))
        for fault in args.faults.split(",")
        for batch in args.batch_max.split(",")
    ]
    if not args.skip_async:
        combos.append((False, "kill", int(args.batch_max.split(",")[0])))
    for synchronous, fault, batch_max in combos:
        for _ in range(args.repeat):
            cluster = HACluster(
                synchronous=synchronous,
                ttl=args.ttl,
                loop_wait=args.loop_wait,
                retry_timeout=args.retry_timeout,
            )
            try:
                cluster.up()
                run, found = _run_on(cluster, fault, batch_max, args.clients, args.seconds)
            finally:
                cluster.down()
            record = _record(synchronous, fault, batch_max, run, found)
            result["runs"].append(record)
            rows.append(_row(record))
            print(record, flush=True)
    if not args.skip_throughput:
        result["throughput"] = _throughput(
            args.clients,
            HACluster(ttl=args.ttl, loop_wait=args.loop_wait, retry_timeout=args.retry_timeout),
        )
    print(table(ROW_HEADERS, rows))
    print(
        f"\nPatroni: ttl {args.ttl}, loop_wait {args.loop_wait}, retry_timeout {args.retry_timeout}"
    )
    if "throughput" in result:
        rates = result["throughput"]
        print(
            f"apply cycles/s, {args.clients} clients: HA (sync) {rates['ha_sync']:.1f}, single"
            f" embedded {rates['single']:.1f}, ratio {rates['ratio']:.2f}"
        )
    emit("failover", "", result)
    return 0


ROW_HEADERS = [
    "replication",
    "fault",
    "batch_max",
    "unavailable",
    "promoted",
    "writes after",
    "cycles",
    "acked lost",
    "releases undone",
    "reports undone",
    "vanished",
    "unacked",
    "errors",
]


def _run_on(
    cluster: HACluster, fault: str, batch_max: int, clients: int, seconds: float
) -> tuple[FailoverRun, Audit]:
    extra = ("--batch-max", str(batch_max))
    with tempfile.TemporaryDirectory() as logs, rm_replicas(cluster.url, 2, Path(logs), extra) as t:
        asyncio.run(setup_cluster(t[0]))
        run = asyncio.run(failover_run(cluster, t, clients=clients, seconds=seconds, fault=fault))
    return run, audit(cluster, run.log)


def _record(
    synchronous: bool, fault: str, batch_max: int, run: FailoverRun, found: Audit
) -> dict[str, Any]:
    return {
        "replication": "sync" if synchronous else "async",
        "fault": fault,
        "batch_max": batch_max,
        "window_s": run.window,
        "promoted_after_s": run.promoted_after,
        "writes_after_s": run.resumed_after,
        "frozen_s": run.frozen_for,
        "cycles": run.log.cycles,
        "retries": run.log.retries,
        "lost_acked": len(found.lost_acked),
        "releases_undone": len(found.released_not_ended),
        "reports_undone": len(found.report_undone),
        "vanished_mid_cycle": len(run.log.vanished),
        "unacked": len(found.unacked),
        "errors": len(run.log.errors),
    }


def _row(record: dict[str, Any]) -> list[str]:
    def seconds(value: float | None, missing: str = "-") -> str:
        return f"{value:.1f} s" if value is not None else missing

    return [
        record["replication"],
        record["fault"],
        str(record["batch_max"]),
        seconds(record["window_s"], "never"),
        seconds(record["promoted_after_s"]),
        seconds(
            record["writes_after_s"],
            "> bound" if record["fault"] in ("freeze", "pause") else "-",
        ),
        str(record["cycles"]),
        str(record["lost_acked"]),
        str(record["releases_undone"]),
        str(record["reports_undone"]),
        str(record["vanished_mid_cycle"]),
        str(record["unacked"]),
        str(record["errors"]),
    ]


def _throughput(clients: int, cluster: HACluster) -> dict[str, float]:
    """The same storm without faults, on `cluster` (sync) against one embedded server."""
    try:
        cluster.up()
        with tempfile.TemporaryDirectory() as logs, rm_replicas(cluster.url, 1, Path(logs)) as t:
            asyncio.run(setup_cluster(t[0]))
            ha_rate = asyncio.run(cycles_per_second(t, clients, 10))
    finally:
        cluster.down()
    single_rate = _single_server_rate(clients)
    return {"ha_sync": ha_rate, "single": single_rate, "ratio": ha_rate / single_rate}


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
