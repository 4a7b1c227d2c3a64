"""EngineConn containment on the real machine: a real RM, a real agent (root) giving each
EngineConn a cgroup of its own before sudo runs, real users, real memory and CPU limits,
real kills. What the RM grants is enforced on the worker; what is used is measured."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import admin_pb2, engine_conn_pb2_grpc, executor_pb2, executor_pb2_grpc
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as rm_pb

from ecm_agent.cgroups import V2_CONTROLLERS, Hierarchy, Layout, Limits, parse_mountinfo
from ecm_agent.containment import Cgroup, Containment, detect_layout
from tests.fixtures.agents import CGROUP_ROOT
from tests.support.agents import agent_beating, start_agent
from tests.support.env import EC_VENV, shared_tmp
from tests.support.messages import lbl, load_instance
from tests.support.refusals import bad_field, refused
from tests.support.rm import assert_consistent, label_state
from tests.support.sdk import ctl, details
from tests.support.waiting import wait_until

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"
MiB = 1024**2
LIVE = {
    ec_pb.ENGINE_CONN_STATE_STARTING,
    ec_pb.ENGINE_CONN_STATE_IDLE,
    ec_pb.ENGINE_CONN_STATE_BUSY,
    ec_pb.ENGINE_CONN_STATE_SHUTTING_DOWN,
}


def ecs(rm: Any) -> engine_conn_pb2_grpc.EngineConnServiceStub:
    return engine_conn_pb2_grpc.EngineConnServiceStub(rm.channel)


async def create(rm: Any, labels: str = SHELL_A, **params: Any) -> Any:
    request = ec_pb.CreateEngineConnRequest(
        user=labels.split("=", 1)[1].split("-", 1)[0],
        labels=lbl(labels),
        params={k: str(v) for k, v in params.items()},
        timeout=Duration(seconds=30),
    )
    return (await ecs(rm).CreateEngineConn(request, timeout=60)).engine_conn


async def get_ec(rm: Any, ec_id: str) -> Any:
    return (
        await ecs(rm).GetEngineConn(ec_pb.GetEngineConnRequest(engine_conn_id=ec_id))
    ).engine_conn


async def ended(rm: Any, ec_id: str) -> Any:
    ec = await get_ec(rm, ec_id)
    return ec if ec.state not in LIVE else None


async def execute(ec: Any, code: str, timeout: float = 60) -> tuple[str, int | None]:
    """Runs `code` in `ec`; (stdout, exit code)."""
    metadata = (("authorization", f"Bearer {ec.secret}"),)
    async with grpc.aio.insecure_channel(ec.address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        out: list[str] = []
        code_: int | None = None
        request = executor_pb2.ExecuteRequest(code=code)
        async for event in stub.Execute(request, timeout=timeout, metadata=metadata):
            if event.HasField("output"):
                if event.output.stream == executor_pb2.OUTPUT_STREAM_STDOUT:
                    out.append(event.output.text)
            else:
                code_ = event.result.exit_code
        return "".join(out), code_


def containment_of(agent: Any) -> Containment:
    """What the test sees of the agent's cgroups (the same layout, found the same way)."""
    return Containment(detect_layout(CGROUP_ROOT, agent.cgroup_parent), 0)


def read(cg: Cgroup, controller: str, name: str) -> str:
    return (cg.dir_of(controller) / name).read_text().strip()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def proc_cgroup(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid` from /proc (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


async def _async(value: Any) -> Any:
    return value


# ----- each EngineConn in its cgroup, held to its grant, measured ---------------------------


async def test_each_engineconn_runs_in_its_own_cgroup_held_to_its_grant_and_measured(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """Every process of the EngineConn, the root-owned launch (sudo) included, is in its
    cgroup, whose limits are the grant (256Mi memory and no swap beyond, 500m CPU, the
    pids limit); its usage measured from the cgroup reaches GetEngineConn, GetTicket, the
    node view and the metrics. The second launch is forked from the user's fork server:
    the fork, too, is contained before it runs."""
    rm = cluster_rm
    agent = await start_agent(rm, agent_factory)
    containment = containment_of(agent)
    first = await create(rm, memory_bytes=256 * MiB, cpu_millis=500)
    assert first.granted_resource == load_instance(256 * MiB, 500, 1) == first.resource
    fresh = await get_ec(rm, first.engine_conn_id)
    cg = containment.cgroup(first.engine_conn_id)
    members = containment.members(cg)
    sudo = os.getpgid(fresh.pid)  # the launch's process group: sudo's, a root process
    assert {fresh.pid, sudo} <= members and os.stat(f"/proc/{sudo}").st_uid == 0
    assert (
        read(cg, "memory", "memory.limit_in_bytes"),
        read(cg, "memory", "memory.memsw.limit_in_bytes"),
        read(cg, "cpu", "cpu.cfs_quota_us"),
        read(cg, "cpu", "cpu.cfs_period_us"),
        read(cg, "pids", "pids.max"),
    ) == (str(256 * MiB), str(256 * MiB), "50000", "100000", "4096")
    own = proc_cgroup(fresh.pid)
    assert f"memory:{containment.layout.hierarchy_of('memory').cgroup_path}/" in own
    # Its code cannot move itself out (into the agent's parent, or anywhere).
    out = containment.layout.hierarchy_of("memory").parent / "cgroup.procs"
    escaped = await execute(first, f"echo $$ > {out} 2>&1 && echo moved; echo rc=$?")
    assert "moved" not in escaped[0] and "rc=1" in escaped[0], escaped

    # The user's fork server is up by now (the first launch started it): a fork.
    await wait_until(lambda: _fork_server_ready(agent), timeout=30, what="a fork server")
    second = await create(rm, memory_bytes=128 * MiB, cpu_millis=250)
    pid = (await get_ec(rm, second.engine_conn_id)).pid
    cg2 = containment.cgroup(second.engine_conn_id)
    assert os.getpgid(pid) == pid  # forked: its own session, no sudo above it
    assert containment.members(cg2) == {pid}
    assert read(cg2, "memory", "memory.limit_in_bytes") == str(128 * MiB)
    assert read(cg2, "cpu", "cpu.cfs_quota_us") == "25000"

    async def measured() -> Any:
        ec = await get_ec(rm, first.engine_conn_id)
        return ec if ec.measured.memory_bytes and ec.measured.cpu_time_micros else None

    ec = await wait_until(measured, timeout=20, what="a measurement in GetEngineConn")
    assert 0 < ec.measured.memory_bytes <= ec.measured.memory_peak_bytes <= 256 * MiB
    assert ec.HasField("measure_time")
    ticket = (await rm.rm.GetTicket(rm_pb.GetTicketRequest(ticket_id=ec.ticket_id))).ticket
    assert ticket.measured.memory_peak_bytes > 0
    print(f"\nmeasured at rest: {ec.measured}")
    # rmctl shows requested, granted and measured side by side.
    ecm = (await rm.rm.GetEcm(rm_pb.GetEcmRequest(instance="agent1"))).ecm
    assert ecm.isolation.mode == "cgroup-v1"
    assert list(ecm.isolation.controllers) == ["memory", "cpu", "cpuacct", "pids", "freezer"]
    samples = await _usage_metrics(rm)
    assert samples[("agent1", "granted", "memory_bytes")] == 384 * MiB
    assert samples[("agent1", "requested", "cpu_millis")] == 750
    assert samples[("agent1", "measured", "memory_bytes")] > 0
    await assert_consistent(rm)


def _fork_server_ready(agent: Any) -> bool:
    return "fork server for lrmtest_a ready" in agent.log_text()


async def _usage_metrics(rm: Any) -> dict[tuple[str, str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    rm.server.metrics.usage._taken = float("-inf")  # no cached scrape
    text = (await rm.server.metrics.exposition()).decode()
    return {
        (s.labels["ecm"], s.labels["kind"], s.labels["dimension"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "labelrm_engine_conn_resource"
        for s in family.samples
    }


async def test_rmctl_asks_for_memory_and_cpu_and_shows_what_is_granted_and_measured(
    cluster_rm: Any, agent_factory: Any, capsys: Any
) -> None:
    """`rmctl engineconn create --memory 512Mi --cpu 500m`: the engine params, the grant
    and the cgroup's limits; `status` shows requested, granted and measured; a request
    over the user's label limit is refused with its shortfall."""
    rm = cluster_rm
    agent = await start_agent(rm, agent_factory)
    argv = ("engineconn", "create", "--labels", SHELL_A, "-q")
    assert await ctl(rm, *argv, "--memory", "512Mi", "--cpu", "500m") == 0
    ec_id = capsys.readouterr().out.strip()
    ec = await get_ec(rm, ec_id)
    assert (ec.params["memory_bytes"], ec.params["cpu_millis"]) == (str(512 * MiB), "500")
    cg = containment_of(agent).cgroup(ec_id)
    assert read(cg, "memory", "memory.limit_in_bytes") == str(512 * MiB)

    async def status() -> dict[str, str] | None:
        assert await ctl(rm, "engineconn", "status", ec_id) == 0
        view = details(capsys.readouterr().out, head_only=True)
        return view if view["measured"] != "-" else None

    view = await wait_until(status, timeout=20, what="status with a measurement")
    assert view["requested"] == view["granted"] == "mem=512Mi cpu=500m inst=1"
    assert view["measured"].startswith("mem=") and " peak=" in view["measured"]
    assert await ctl(rm, "node", "list") == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["agent1", "RUNNING", "cgroup-v1"]

    limit = load_instance(1 << 30, 4000, 8)
    await rm.admin.SetLabelLimit(
        admin_pb2.SetLabelLimitRequest(labels=lbl(SHELL_A), max_resource=limit)
    )
    assert await ctl(rm, *argv, "--memory", "2Gi") == 1
    err = capsys.readouterr().err
    # (the record starts with the limit: the EngineConn above ran before it was set)
    assert "memory_bytes: requested 2Gi, available 1Gi" in err, err
    assert await ctl(rm, *argv, "--memory", "lots") == 2
    assert "invalid memory quantity 'lots'" in capsys.readouterr().err


# ----- over its memory ------------------------------------------------------------------


async def test_over_its_memory_an_engineconn_is_stopped_with_the_reason_neighbours_go_on(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """An EngineConn granted 256Mi that allocates 1 GiB is stopped, FAILED with "out of
    memory: limit 256Mi", its ticket released; a second EngineConn of the same user keeps
    answering."""
    rm = cluster_rm
    agent = await start_agent(rm, agent_factory)
    victim = await create(rm, memory_bytes=256 * MiB)
    neighbour = await create(rm, memory_bytes=256 * MiB)
    cg = containment_of(agent).cgroup(victim.engine_conn_id)
    # Touched, not only reserved: b"x" * n writes every page.
    hog = asyncio.ensure_future(execute(victim, "/usr/bin/python3 -c 'x = b\"x\" * (1 << 30)'"))
    final = await wait_until(lambda: ended(rm, victim.engine_conn_id), timeout=60, what="stopped")
    with contextlib.suppress(grpc.aio.AioRpcError):
        await hog  # its stream broke with the EngineConn, or it saw the kill
    assert final.state == ec_pb.ENGINE_CONN_STATE_FAILED, final
    assert final.reason == "out of memory: limit 256Mi"
    ticket = (await rm.rm.GetTicket(rm_pb.GetTicketRequest(ticket_id=final.ticket_id))).ticket
    assert ticket.state == rm_pb.TICKET_STATE_RELEASED
    assert final.measured.memory_peak_bytes <= 256 * MiB == ticket.measured.memory_peak_bytes
    print(f"\nstopped over its memory: {final.reason}; measured {final.measured}")
    assert not containment_of(agent).exists(cg)  # removed with everything in it
    assert (await execute(neighbour, "echo alive"))[0] == "alive\n"
    # (BUSY until the report that its execution ended lands)
    assert (await get_ec(rm, neighbour.engine_conn_id)).state in LIVE
    await assert_consistent(rm)


# ----- CPU --------------------------------------------------------------------------------


async def test_half_a_core_holds_a_busy_loop_in_two_processes(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """Granted 500m, two busy processes use at most ~0.6 of a core over 10 s: measured
    from the cgroup (cpuacct.usage) and from /proc (their utime + stime); the quota
    visibly throttled them."""
    rm = cluster_rm
    agent = await start_agent(rm, agent_factory)
    ec = await create(rm, cpu_millis=500)
    cg = containment_of(agent).cgroup(ec.engine_conn_id)
    loop = "sh -c 'while :; do :; done'"
    busy = asyncio.ensure_future(
        execute(ec, f"for i in 1 2; do timeout 20 {loop} & done; wait; echo done", timeout=90)
    )
    uid = pwd.getpwnam("lrmtest_a").pw_uid

    def spinners() -> list[int]:
        found = [
            p
            for p in containment_of(agent).members(cg)
            if cmdline(p).startswith(b"sh\0-c\0while") and os.stat(f"/proc/{p}").st_uid == uid
        ]
        return found if len(found) == 2 else []

    pids = await wait_until(spinners, timeout=20, what="two busy processes in the cgroup")
    throttled_before = _throttled(cg)
    start, usage0, ticks0 = time.monotonic(), int(read(cg, "cpuacct", "cpuacct.usage")), 0
    ticks0 = sum(cpu_ticks(p) for p in pids)
    await asyncio.sleep(10)  # the measuring window (what is asserted is the CPU used in it)
    usage1, ticks1 = int(read(cg, "cpuacct", "cpuacct.usage")), sum(cpu_ticks(p) for p in pids)
    wall = time.monotonic() - start
    cgroup_cores = (usage1 - usage0) / 1e9 / wall
    proc_cores = (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / wall
    print(f"\nCPU granted 500m, two busy loops over {wall:.1f} s: cgroup {cgroup_cores:.3f}"
          f" cores, /proc {proc_cores:.3f} cores")  # fmt: skip
    assert cgroup_cores <= 0.6 and proc_cores <= 0.6
    assert _throttled(cg) > throttled_before  # the quota, not the machine, held them
    assert (await busy)[0].endswith("done\n")


def _throttled(cg: Cgroup) -> int:
    for line in read(cg, "cpu", "cpu.stat").splitlines():
        if line.startswith("nr_throttled "):
            return int(line.split()[1])
    raise AssertionError("no nr_throttled in cpu.stat")


# ----- kill means all of it -----------------------------------------------------------------


@pytest.mark.parametrize("path", ["kill", "idle_exit", "fencing_after_lost", "agent_stop"])
async def test_a_setsid_escapee_survives_no_kill_path(
    cluster_rm: Any, agent_factory: Any, path: str
) -> None:
    """Code in an EngineConn runs `setsid -f sleep 600`: out of the EngineConn's process
    group and session, but not out of its cgroup. Whichever way the EngineConn ends, the
    sleep goes with it and the cgroup is removed."""
    rm = cluster_rm
    agent = await start_agent(rm, agent_factory)
    idle = 4 if path == "idle_exit" else 600
    ec = await create(rm, max_idle_seconds=idle)
    cg = containment_of(agent).cgroup(ec.engine_conn_id)
    # The execution waits for its escapee to be out of its session (the engine ends the
    # execution's process group when it completes, and would end one still in it); the
    # escapee's output goes elsewhere, so the execution does not wait for it to end. It
    # sleeps a duration of its own: other tests' escapees of the same user may be running.
    duration = f"600.{uuid.uuid4().int % 10**6:06d}"
    started = await execute(
        ec,
        f"setsid -f sleep {duration} </dev/null &>/dev/null; "
        f"until pgrep -u $(id -u) -f '^sleep {duration}$' >/dev/null; do sleep 0.01; done; "
        "echo started",
    )
    assert started[0] == "started\n"

    def escapee() -> int | None:
        argv = f"sleep\0{duration}\0".encode()
        found = [p for p in containment_of(agent).members(cg) if cmdline(p) == argv]
        return found[0] if found else None

    def seen() -> str:
        members = containment_of(agent).members(cg)
        return f"the escapee among {[(p, cmdline(p)) for p in sorted(members)]}"

    pid = await wait_until(escapee, timeout=10, what=seen)
    main = (await get_ec(rm, ec.engine_conn_id)).pid
    assert os.getsid(pid) != os.getsid(main)  # it left the EngineConn's session
    if path == "kill":
        await ecs(rm).KillEngineConn(ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id))
    elif path == "fencing_after_lost":
        agent.kill()  # silent past the ECM expiry: LOST, released ...
        lost = await wait_until(lambda: ended(rm, ec.engine_conn_id), timeout=30, what="LOST")
        assert lost.state == ec_pb.ENGINE_CONN_STATE_LOST
        agent.start()  # ... and on its return the RM fences what it no longer recognises
        await wait_until(lambda: agent_beating(rm.rm, "agent1"), timeout=30)
    elif path == "agent_stop":  # excluded: the RM shuts the agent down for good
        await rm.admin.RefreshNodes(admin_pb2.RefreshNodesRequest(exclude=["agent1"]))
        await wait_until(lambda: _async(agent.proc.poll() is not None), timeout=30)
        assert agent.proc.returncode == 0
    await wait_until(lambda: _async(not alive(pid)), timeout=30, what=f"the escapee gone ({path})")
    await wait_until(
        lambda: _async(not containment_of(agent).exists(cg)), timeout=30, what="cgroup removed"
    )
    if path == "agent_stop":
        assert not any(h.parent.exists() for h in containment_of(agent).layout.hierarchies)
    else:
        await wait_until(lambda: ended(rm, ec.engine_conn_id), timeout=30, what="ended")
        await assert_consistent(rm)


# ----- an EngineConn's word never lowers its charge -------------------------------------------


async def test_an_engineconns_own_report_cannot_lower_what_its_ticket_charges(
    cluster_rm: Any, agent_factory: Any
) -> None:
    """The attack: while its EngineConn starts (its launch held, as a user's SIGSTOP of
    launch.sh holds it), the user reports it IDLE with used_resource 1 byte, 1 millicore,
    0 instances. Refused, INVALID_ARGUMENT naming used_resource; its ticket charges the
    whole grant, and an ECM of two instances runs two EngineConns, not three."""
    rm = cluster_rm
    gate = shared_tmp("lrm-gate-")
    held = gate / "python"
    held.write_text(
        f"#!/bin/bash\nwhile [ ! -e {gate}/go ]; do sleep 0.05; done\n"
        f'exec {EC_VENV}/bin/python "$@"\n'
    )
    held.chmod(0o755)
    await start_agent(
        rm, agent_factory, "agent1", "--total-instances", "2", "--fork-servers", "0",
        python=str(held),
    )  # fmt: skip
    creating = asyncio.ensure_future(create(rm))

    async def launched() -> Any:
        listed = (await ecs(rm).ListEngineConns(ec_pb.ListEngineConnsRequest())).engine_conns
        return next((e for e in listed if e.ecm_instance and e.ticket_id), None)

    starting = await wait_until(launched, timeout=20, what="the launch")
    report = ec_pb.ReportEngineConnStateRequest(
        engine_conn_id=starting.engine_conn_id,
        state=ec_pb.ENGINE_CONN_STATE_IDLE,
        address="127.0.0.1:9",
        used_resource=load_instance(1, 1, 0),
    )
    err = await refused(
        ecs(rm).ReportEngineConnState(report), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
    )
    assert bad_field(err) == "used_resource"
    assert (await get_ec(rm, starting.engine_conn_id)).state == ec_pb.ENGINE_CONN_STATE_STARTING
    (gate / "go").touch()  # the held launch goes on: the real EngineConn reports ready
    first = await creating
    ticket = (await rm.rm.GetTicket(rm_pb.GetTicketRequest(ticket_id=first.ticket_id))).ticket
    assert ticket.used_resource == load_instance(256 * MiB, 500, 1)
    second = await create(rm)
    assert second.state == ec_pb.ENGINE_CONN_STATE_IDLE
    await refused(create(rm), grpc.StatusCode.RESOURCE_EXHAUSTED, "NO_ECM_WITH_CAPACITY")
    record = await label_state(rm, "emInstance=agent1")
    assert record.used_resource.load_instance.instances == 2
    await assert_consistent(rm)


# ----- an agent says what it can enforce --------------------------------------------------------


async def test_without_cgroups_an_agent_refuses_to_start_unless_isolation_none(
    cluster_rm: Any, agent_factory: Any, capsys: Any
) -> None:
    """A host without cgroup access (a cgroup root that is no cgroup file system): the agent
    refuses to start, saying why and what to set; with `--isolation none` it starts, and
    the node shows it."""
    rm = cluster_rm
    fake_root = shared_tmp("lrm-no-cgroups-")
    blocked = agent_factory(rm.target, "agent2", "--cgroup-root", str(fake_root))
    blocked.start()
    await wait_until(lambda: _async(blocked.proc.poll() is not None), timeout=30, what="exit")
    log = blocked.log_text()
    assert blocked.proc.returncode == 2, log
    assert log.startswith("ecm-agent: error: cannot contain EngineConns: no cgroup hierarchy")
    assert 'isolation = "none"' in log and log.count("\n") == 1
    await refused(
        rm.rm.GetEcm(rm_pb.GetEcmRequest(instance="agent2")), grpc.StatusCode.NOT_FOUND, "NOT_FOUND"
    )

    await start_agent(rm, agent_factory, "agent3", "--cgroup-root", str(fake_root),
                      "--isolation", "none")  # fmt: skip
    ecm = (await rm.rm.GetEcm(rm_pb.GetEcmRequest(instance="agent3"))).ecm
    assert ecm.isolation.mode == "none" and not ecm.isolation.controllers
    capsys.readouterr()
    assert await ctl(rm, "node", "list") == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[:3] for row in rows] == [["agent3", "RUNNING", "none"]]
    ec = await create(rm)  # it runs EngineConns, uncontained and unmeasured
    assert ec.ecm_instance == "agent3" and not ec.HasField("measured")


# ----- cgroup v2: cgroup.kill -------------------------------------------------------------


async def test_cgroup_kill_on_the_v2_hierarchy_ends_a_setsid_escapee(
    sudo_users: tuple[str, ...],
) -> None:
    """The kill of the v2 layout, on this machine's v2 hierarchy (it carries no
    controllers here, so no limits: cgroup.kill and cgroup.events are core files): a
    process joined through the launch prefix and the one it set loose with setsid are
    both ended, and the cgroup is removed."""
    unified = [m for m in parse_mountinfo(_mountinfo()) if m.version == 2]
    assert unified, "no cgroup2 hierarchy mounted on this machine"
    name = f"lrmtest-v2-{uuid.uuid4().hex[:12]}"
    parent = unified[0].path / name
    parent.mkdir()
    layout = Layout(2, (Hierarchy(parent, V2_CONTROLLERS, f"/{name}"),))
    containment = Containment(layout, 0)
    cg = containment.create("ec-1", Limits())
    try:
        command = [
            *containment.join_command(cg),
            "/bin/sh",
            "-c",
            "setsid -f sleep 600; exec sleep 600",
        ]
        proc = await asyncio.create_subprocess_exec(*command, start_new_session=True)

        def escaped() -> set[int] | None:
            # Two sessions, one cgroup: counted once `setsid -f`'s child has left the
            # session (it is a member from its fork, before its setsid()).
            members = containment.members(cg)
            sessions = {os.getsid(p) for p in members if alive(p)}
            return members if len(members) == 2 and len(sessions) == 2 else None

        pids = await wait_until(
            lambda: _async(escaped()),
            timeout=10,
            what="the process and its escapee, in a session of its own, in the cgroup",
        )
        assert await containment.destroy(cg)
        assert not any(alive(p) for p in pids) and not containment.exists(cg)
        assert await proc.wait() == -9
    finally:
        if containment.exists(cg):  # a failure above: leave no process and no cgroup
            await containment.destroy(cg)
        parent.rmdir()
