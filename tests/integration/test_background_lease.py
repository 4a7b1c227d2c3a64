"""Background jobs run on one replica at a time, and move when it dies.

Two rm-server processes on one database: each background job (ticket sweep, liveness,
demand planner) has one lease row and one replica that says it runs it; after kill -9
of the ticket sweep's runner, the survivor takes the lease over within its time to live
and reclaims an expired ticket.
"""

from __future__ import annotations

import re
import subprocess
import sys

import grpc
import psycopg
from labelrm.v1 import admin_pb2, admin_pb2_grpc, resource_manager_pb2_grpc
from labelrm.v1 import resource_manager_pb2 as pb

from tests.support.env import ROOT
from tests.support.messages import GiB, apply_req, load, load_instance, register
from tests.support.waiting import wait_until_sync

JOBS = ("demand-planner", "liveness", "ticket-sweep", "usage-rollup")
RUNS = re.compile(r"background job (\S+): this replica \((\S+)\) runs it")


def _leases(database_url: str) -> dict[str, str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT job, holder FROM background_lease").fetchall()
    return {job: holder for job, holder in rows}


def _runners(proc) -> dict[str, str]:
    """job -> replica id, from the 'runs it' lines of one process's log."""
    return {m.group(1): m.group(2) for m in RUNS.finditer(proc.log_path.read_text())}


def test_each_job_runs_on_one_replica_and_moves_when_it_dies(rm_process_factory, database_url):
    first = rm_process_factory("--sweep-interval", "0.2", "--lock-timeout", "1")
    second = rm_process_factory("--sweep-interval", "0.2", "--lock-timeout", "1")
    first.start()
    second.start()
    leases = wait_until_sync(
        lambda: (found := _leases(database_url)) and set(found) == set(JOBS) and found,
        30,
        what="a lease row for every job",
    )
    runners = [_runners(first), _runners(second)]
    for job in JOBS:
        claimed = [r[job] for r in runners if job in r]
        assert claimed == [leases[job]], f"{job}: run by {claimed}, lease {leases[job]}"
    _cluster_info_names_the_lease_holders(first.target, leases)

    holder = first if "ticket-sweep" in runners[0] else second
    survivor = second if holder is first else first
    holder.kill()
    with grpc.insecure_channel(survivor.target) as channel:
        rm = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        rm.RegisterEcm(register("lease:1", load_instance(GiB, 1000, 1)), timeout=10)
        ticket = rm.Apply(apply_req("emInstance=lease:1", load(1, 1)), timeout=10).ticket

        def reclaimed() -> bool:
            found = rm.GetTicket(pb.GetTicketRequest(ticket_id=ticket.ticket_id), timeout=5)
            return bool(found.ticket.state == pb.TICKET_STATE_EXPIRED)

        # Lease time to live (5 s) + lock timeout (1 s) + a margin for a loaded machine.
        wait_until_sync(reclaimed, 30, what="the survivor reclaims the expired ticket")
    assert _leases(database_url)["ticket-sweep"] == _runners(survivor)["ticket-sweep"]


def _cluster_info_names_the_lease_holders(target: str, leases: dict[str, str]) -> None:
    """GetClusterInfo lists, per replica, the jobs whose lease it holds; `rmctl status`
    says it on the replicas line."""
    held: dict[str, list[str]] = {}
    for job, holder in leases.items():
        held.setdefault(holder, []).append(job)
    with grpc.insecure_channel(target) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        info = admin.GetClusterInfo(admin_pb2.GetClusterInfoRequest(), timeout=10)
    assert {r.replica_id: list(r.leases) for r in info.replicas if r.leases} == {
        holder: sorted(jobs) for holder, jobs in held.items()
    }
    status = subprocess.run(
        [sys.executable, "-m", "rmctl", "--rm", target, "status"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    ).stdout
    line = next(ln for ln in status.splitlines() if ln.strip().startswith("replicas"))
    for holder, jobs in held.items():
        assert f"{holder} on " in line and f"runs {', '.join(sorted(jobs))})" in line, line
