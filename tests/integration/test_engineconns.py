"""EngineConns end to end: a real RM, a real agent (root) launching through real sudo
as real unprivileged users, the real EngineConn runtime, real processes."""

from __future__ import annotations

import asyncio
import functools
import os
import pwd
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import admin_pb2, engine_conn_pb2_grpc, executor_pb2, executor_pb2_grpc
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as rm_pb

from rm_server.clock import ManualClock
from tests.support.agents import agent_beating, start_agent
from tests.support.env import ENGINECONN_TEST_SETTINGS
from tests.support.messages import GiB, lbl, load_instance, register
from tests.support.refusals import refused
from tests.support.rm import assert_consistent, label_state, start_in_process, stop_in_process
from tests.support.waiting import wait_until

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"
T = TypeVar("T")
LIVE = {
    ec_pb.ENGINE_CONN_STATE_STARTING,
    ec_pb.ENGINE_CONN_STATE_IDLE,
    ec_pb.ENGINE_CONN_STATE_BUSY,
    ec_pb.ENGINE_CONN_STATE_SHUTTING_DOWN,
}


def ecs(rm: Any) -> engine_conn_pb2_grpc.EngineConnServiceStub:
    return engine_conn_pb2_grpc.EngineConnServiceStub(rm.channel)


async def create(
    rm: Any, labels: str = SHELL_A, user: str = "lrmtest_a", request_id: str = "", **params: Any
) -> Any:
    return (
        await ecs(rm).CreateEngineConn(
            ec_pb.CreateEngineConnRequest(
                request_id=request_id,
                user=user,
                labels=lbl(labels),
                params={k: str(v) for k, v in params.items()},
                timeout=Duration(seconds=30),
            ),
            timeout=60,
        )
    ).engine_conn


async def get_ec(rm: Any, ec_id: str) -> Any:
    return (
        await ecs(rm).GetEngineConn(ec_pb.GetEngineConnRequest(engine_conn_id=ec_id))
    ).engine_conn


async def execute(ec: Any, code: str, secret: str | None = None) -> tuple[str, str, int | None]:
    """Run `code` in `ec` (an EngineConn from Create / Ask / Get) with its secret, or with
    `secret` instead ("" sends no authorization at all)."""
    secret = ec.secret if secret is None else secret
    metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
    async with grpc.aio.insecure_channel(ec.address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        out: list[str] = []
        err: list[str] = []
        code_: int | None = None
        request = executor_pb2.ExecuteRequest(code=code)
        async for event in stub.Execute(request, timeout=30, metadata=metadata):
            if event.HasField("output"):
                (out if event.output.stream == executor_pb2.OUTPUT_STREAM_STDOUT else err).append(
                    event.output.text
                )
            else:
                code_ = event.result.exit_code
        return "".join(out), "".join(err), code_


async def heard_after(rm: Any, agent_id: str, since: datetime) -> bool:
    """Whether the RM recorded a heartbeat of `agent_id` later than `since`."""
    ecm = (await rm.rm.GetEcm(rm_pb.GetEcmRequest(instance=agent_id))).ecm
    return bool(ecm.last_heartbeat_time.ToDatetime(tzinfo=UTC) > since)


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    members.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return members


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise AssertionError("no Uid line")


async def ended(rm: Any, ec_id: str) -> Any:
    ec = await get_ec(rm, ec_id)
    return ec if ec.state not in LIVE else None


async def ticket_state(rm: Any, ticket_id: str) -> int:
    state: int = (await rm.rm.GetTicket(rm_pb.GetTicketRequest(ticket_id=ticket_id))).ticket.state
    return state


async def test_shell_engineconn_runs_as_the_user_and_kill_releases(cluster_rm, agent_factory):
    rm = cluster_rm
    await start_agent(rm, agent_factory)
    ec = await create(rm)
    assert ec.state == ec_pb.ENGINE_CONN_STATE_IDLE
    assert ec.address and ec.ecm_instance == "agent1"
    assert [c.instance for c in ec.ecm_choices] == ["agent1"] and ec.ecm_choices[0].eligible
    assert await ticket_state(rm, ec.ticket_id) == rm_pb.TICKET_STATE_USED
    out, _, code = await execute(ec, "id -un")
    assert (out.strip(), code) == ("lrmtest_a", 0)
    gauges = await state_gauges(rm)
    assert gauges[("labelrm_ecms", "RUNNING")] == 1
    # IDLE, or still BUSY if the report that the execution ended is under way.
    assert gauges[("labelrm_engine_conns", "IDLE")] + gauges[("labelrm_engine_conns", "BUSY")] == 1
    assert gauges[("labelrm_engine_conns", "FAILED")] == 0
    fresh = await get_ec(rm, ec.engine_conn_id)
    uid_a = pwd.getpwnam("lrmtest_a").pw_uid
    # The reported pid is the EngineConn's own process, not the root-owned sudo above it.
    assert uid_of(fresh.pid) == uid_a
    assert not cmdline(fresh.pid).startswith(b"sudo\0")
    pgid = os.getpgid(fresh.pid)
    members = group_members(pgid)
    assert fresh.pid in members
    assert all(uid_of(p) in (0, uid_a) for p in members)  # sudo's side, then the user's
    await ecs(rm).KillEngineConn(ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id))
    final = await wait_until(lambda: ended(rm, ec.engine_conn_id), timeout=20)
    assert final.state in (ec_pb.ENGINE_CONN_STATE_SUCCEEDED, ec_pb.ENGINE_CONN_STATE_FAILED)
    await wait_until(lambda: _async(not group_members(pgid)), timeout=20)
    assert await ticket_state(rm, ec.ticket_id) == rm_pb.TICKET_STATE_RELEASED
    await assert_consistent(rm)


async def test_executor_needs_the_secret_only_its_owner_gets(cluster_rm, agent_factory):
    rm = cluster_rm
    agent = await start_agent(rm, agent_factory)
    ec = await create(rm)
    secret = ec.secret
    assert len(secret) == 43  # 32 random bytes, URL-safe base64 without padding
    # Without it, or with another, nobody runs code there; with it, the owner does.
    for wrong in ("", "x" * 43, secret[:-1], (await create(rm)).secret):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await execute(ec, "id -un", secret=wrong)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with grpc.aio.insecure_channel(ec.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await executor_pb2_grpc.ExecutorServiceStub(channel).Cancel(
                executor_pb2.CancelRequest()
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (await execute(ec, "id -un"))[0].strip() == "lrmtest_a"
    # Get and a reusing Ask hand it back; lists and Kill never carry a secret.
    assert (await get_ec(rm, ec.engine_conn_id)).secret == secret
    ask = ec_pb.AskEngineConnRequest(
        user="lrmtest_a", labels=lbl(SHELL_A), timeout=Duration(seconds=30)
    )
    asked = await ecs(rm).AskEngineConn(ask)
    assert asked.reused
    assert asked.engine_conn.secret == (await get_ec(rm, asked.engine_conn.engine_conn_id)).secret
    listed = (await ecs(rm).ListEngineConns(ec_pb.ListEngineConnsRequest())).engine_conns
    assert len(listed) == 2 and all(e.secret == "" for e in listed)
    killed = await ecs(rm).KillEngineConn(
        ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id)
    )
    assert killed.engine_conn.secret == ""
    # It reached the EngineConn through the launch environment only: not its argv (which
    # `ps` shows to everyone), not its logs, not the agent's log.
    work = Path(ec.work_dir)
    logs = "".join(p.read_text() for p in (work / "logs").iterdir())
    assert ec.engine_conn_id in logs and secret not in logs
    assert secret not in agent.log_text()
    pgid = os.getpgid((await get_ec(rm, ec.engine_conn_id)).pid)
    assert all(secret.encode() not in cmdline(p) for p in group_members(pgid))
    await assert_consistent(rm)


async def state_gauges(rm: Any) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = (await rm.server.metrics.exposition()).decode()
    return {
        (sample.name, sample.labels["state"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name in ("labelrm_ecms", "labelrm_engine_conns")
        for sample in family.samples
    }


async def _async(value: T) -> T:
    return value


async def test_idle_engineconns_of_two_users_exit_by_themselves(cluster_rm, agent_factory):
    rm = cluster_rm
    await start_agent(rm, agent_factory)
    made = await asyncio.gather(
        create(rm, max_idle_seconds=2),
        create(rm, max_idle_seconds=2),
        create(
            rm, "userCreator=lrmtest_b-IDE,engineType=python-3", "lrmtest_b", max_idle_seconds=2
        ),
    )
    assert {e.user for e in made} == {"lrmtest_a", "lrmtest_b"}
    assert all(e.pid and e.work_dir for e in made)  # the agent's report is part of ready
    for ec in made:
        final = await wait_until(functools.partial(ended, rm, ec.engine_conn_id), timeout=30)
        assert final.state == ec_pb.ENGINE_CONN_STATE_SUCCEEDED, final
        assert await ticket_state(rm, ec.ticket_id) == rm_pb.TICKET_STATE_RELEASED
    await assert_consistent(rm)


async def test_ask_reuses_an_idle_engineconn_but_not_a_held_one(cluster_rm, agent_factory):
    rm = cluster_rm
    await start_agent(rm, agent_factory)
    first = await create(rm)
    ask = ec_pb.AskEngineConnRequest(
        user="lrmtest_a", labels=lbl(SHELL_A), timeout=Duration(seconds=30)
    )
    reused = await ecs(rm).AskEngineConn(ask)
    assert reused.reused and reused.engine_conn.engine_conn_id == first.engine_conn_id
    again = await ecs(rm).AskEngineConn(ask)
    assert not again.reused and again.engine_conn.engine_conn_id != first.engine_conn_id
    # A BUSY one is not handed out either: keep the second one busy, its hold expired.
    busy = again.engine_conn
    running = asyncio.ensure_future(execute(busy, "sleep 5; echo done"))
    await wait_until(lambda: _is_busy(rm, busy.engine_conn_id), timeout=10)
    third = await ecs(rm).AskEngineConn(
        ec_pb.AskEngineConnRequest(
            user="lrmtest_a",
            labels=lbl(SHELL_A),
            timeout=Duration(seconds=30),
            hold=Duration(nanos=1),
        )
    )
    assert third.engine_conn.engine_conn_id not in (first.engine_conn_id, busy.engine_conn_id)
    assert (await running)[0].strip() == "done"
    await assert_consistent(rm)


async def test_an_engineconn_ask_created_is_held_for_its_caller(cluster_rm, agent_factory):
    rm = cluster_rm
    await start_agent(rm, agent_factory)
    ask = ec_pb.AskEngineConnRequest(
        user="lrmtest_a", labels=lbl(SHELL_A), timeout=Duration(seconds=30)
    )
    made = await ecs(rm).AskEngineConn(replace_request_id(ask, "ask-1"))
    assert not made.reused
    assert made.engine_conn.holder == "ask-1" and made.engine_conn.HasField("hold_expire_time")
    stored = await get_ec(rm, made.engine_conn.engine_conn_id)
    assert stored.holder == "ask-1"
    assert stored.hold_expire_time == made.engine_conn.hold_expire_time
    # Held like a reused one: the next Ask does not get it, it gets its own.
    other = await ecs(rm).AskEngineConn(replace_request_id(ask, "ask-2"))
    assert not other.reused
    assert other.engine_conn.engine_conn_id != made.engine_conn.engine_conn_id
    assert other.engine_conn.holder == "ask-2"
    # A retry of the first Ask answers the same EngineConn, still held by it.
    again = await ecs(rm).AskEngineConn(replace_request_id(ask, "ask-1"))
    assert again.engine_conn.engine_conn_id == made.engine_conn.engine_conn_id
    assert (await get_ec(rm, made.engine_conn.engine_conn_id)).holder == "ask-1"
    await assert_consistent(rm)


def replace_request_id(request: Any, request_id: str) -> Any:
    copy = type(request)()
    copy.CopyFrom(request)
    copy.request_id = request_id
    return copy


async def test_create_answers_with_the_process_its_agent_reported(rm):
    """A forked EngineConn (from a warm fork server) can report itself ready before its
    agent's next heartbeat carries its process. Create answers with the pid and work dir
    all the same: an EngineConn is ready once both have reported. (A stand-in agent over
    the real wire, so that the order is the bad one every time.)"""
    await rm.rm.RegisterEcm(register("fake1", load_instance(4 * GiB, 4000, 4)))
    await rm.rm.Heartbeat(rm_pb.HeartbeatRequest(agent_id="fake1", sequence=1))
    stream = ecs(rm).StreamAgentCommands(ec_pb.StreamAgentCommandsRequest(agent_id="fake1"))
    try:
        creating = asyncio.ensure_future(create(rm))
        command = (await stream.read()).command
        ec_id = command.launch.engine_conn_id
        assert command.WhichOneof("command") == "launch" and ec_id
        # The EngineConn first ...
        await ecs(rm).ReportEngineConnState(
            ec_pb.ReportEngineConnStateRequest(
                engine_conn_id=ec_id, state=ec_pb.ENGINE_CONN_STATE_IDLE, address="127.0.0.1:9"
            )
        )
        # (long enough for a Create that answers now to have answered)
        await asyncio.wait([creating], timeout=2)
        # ... then the agent's heartbeat with the process.
        process = ec_pb.EngineConnProcess(
            engine_conn_id=ec_id,
            state=ec_pb.PROCESS_STATE_RUNNING,
            pid=4242,
            work_dir="/var/lib/labelrm/work/x",
        )
        await rm.rm.Heartbeat(
            rm_pb.HeartbeatRequest(
                agent_id="fake1",
                sequence=2,
                engine_conns=[process],
                done_command_ids=[command.command_id],
            )
        )
        ec = await creating
    finally:
        stream.cancel()
    assert ec.state == ec_pb.ENGINE_CONN_STATE_IDLE and ec.address == "127.0.0.1:9"
    assert (ec.pid, ec.work_dir) == (4242, "/var/lib/labelrm/work/x")
    await assert_consistent(rm)


async def _is_busy(rm: Any, ec_id: str) -> bool:
    return bool((await get_ec(rm, ec_id)).state == ec_pb.ENGINE_CONN_STATE_BUSY)


async def test_a_report_that_arrived_earlier_never_undoes_a_later_one(database_url):
    """An EngineConn reports BUSY then IDLE, one call after the other; a call it gave up
    waiting for (its deadline passed, the RM slow) may still be running in the RM while the
    next is answered. Applied after the IDLE, the BUSY stood until the next report: an idle
    EngineConn shown and refused as busy (seen under load: `rmctl engineconn status` BUSY
    after it had settled IDLE). Reports are ordered by when they reached the RM; the clock
    the RM stamps them with is moved back to play the late one."""
    clock = ManualClock()
    rm = await start_in_process(database_url, clock=clock)
    try:
        await rm.rm.RegisterEcm(register("fake1", load_instance(4 * GiB, 4000, 4)))
        await rm.rm.Heartbeat(rm_pb.HeartbeatRequest(agent_id="fake1", sequence=1))
        stream = ecs(rm).StreamAgentCommands(ec_pb.StreamAgentCommandsRequest(agent_id="fake1"))
        try:
            creating = asyncio.ensure_future(create(rm))
            command = (await stream.read()).command
            ec_id = command.launch.engine_conn_id
            process = ec_pb.EngineConnProcess(
                engine_conn_id=ec_id, state=ec_pb.PROCESS_STATE_RUNNING, pid=4242, work_dir="/w"
            )
            await rm.rm.Heartbeat(
                rm_pb.HeartbeatRequest(
                    agent_id="fake1",
                    sequence=2,
                    engine_conns=[process],
                    done_command_ids=[command.command_id],
                )
            )

            async def report(state: int) -> None:
                await ecs(rm).ReportEngineConnState(
                    ec_pb.ReportEngineConnStateRequest(
                        engine_conn_id=ec_id, state=state, address="127.0.0.1:9"
                    )
                )

            await report(ec_pb.ENGINE_CONN_STATE_IDLE)  # ready
            assert (await creating).state == ec_pb.ENGINE_CONN_STATE_IDLE
        finally:
            stream.cancel()
        clock.advance(10)
        await report(ec_pb.ENGINE_CONN_STATE_BUSY)  # an execution starts
        assert (await get_ec(rm, ec_id)).state == ec_pb.ENGINE_CONN_STATE_BUSY
        clock.advance(10)
        await report(ec_pb.ENGINE_CONN_STATE_IDLE)  # and ends
        clock.advance(-5)  # a BUSY that reached the RM before that IDLE, applied after it
        await report(ec_pb.ENGINE_CONN_STATE_BUSY)
        assert (await get_ec(rm, ec_id)).state == ec_pb.ENGINE_CONN_STATE_IDLE
        clock.advance(10)  # a report that reached the RM after them all counts
        await report(ec_pb.ENGINE_CONN_STATE_BUSY)
        assert (await get_ec(rm, ec_id)).state == ec_pb.ENGINE_CONN_STATE_BUSY
        await assert_consistent(rm)
    finally:
        await stop_in_process(rm)


async def test_launch_exiting_3_fails_with_exit_code_and_stderr(
    cluster_rm, agent_factory, tmp_path
):
    rm = cluster_rm
    script = _shared_script("#!/bin/bash\necho 'engine blew up: bad config' >&2\nexit 3\n")
    await start_agent(rm, agent_factory, python=str(script))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await create(rm)
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "exited with code 3" in exc.value.details()
    assert "engine blew up: bad config" in exc.value.details()
    tickets = await rm.rm.ListTickets(rm_pb.ListTicketsRequest())
    assert list(tickets.tickets) == []  # nothing stays locked
    await assert_consistent(rm)


def _shared_script(text: str) -> Path:
    from tests.support.env import shared_tmp

    path = shared_tmp("lrm-script-") / "fake-python"
    path.write_text(text)
    path.chmod(0o755)
    return path


async def test_root_and_unknown_users_are_refused_by_the_agent(cluster_rm, agent_factory):
    rm = cluster_rm
    agent = await start_agent(rm, agent_factory)
    for user in ("root", "nobody"):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await create(rm, f"userCreator={user}-IDE,engineType=shell-1", user)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "refused" in exc.value.details()
    assert not list((agent.root / "state").glob("*.json"))  # nothing was launched
    await assert_consistent(rm)


async def test_kill_9_engineconn_is_reported_and_released(cluster_rm, agent_factory):
    rm = cluster_rm
    await start_agent(rm, agent_factory)
    ec = await create(rm)
    fresh = await get_ec(rm, ec.engine_conn_id)
    for pid in group_members(os.getpgid(fresh.pid)):
        os.kill(pid, 9)
    final = await wait_until(lambda: ended(rm, ec.engine_conn_id), timeout=20)
    assert final.state in (ec_pb.ENGINE_CONN_STATE_FAILED, ec_pb.ENGINE_CONN_STATE_LOST)
    assert await ticket_state(rm, ec.ticket_id) == rm_pb.TICKET_STATE_RELEASED
    await assert_consistent(rm)


@pytest.fixture
async def patient_rm(database_url):
    """A cluster RM whose expiries outlast an agent's restart on a busy machine (the
    agent must be back before its ECM is judged LOST), yet not by much (the test then
    waits one out)."""
    settings = {**ENGINECONN_TEST_SETTINGS, "ecm_expiry": 12.0, "ec_expiry": 15.0}
    rm = await start_in_process(database_url, **settings)
    try:
        yield rm
    finally:
        await stop_in_process(rm)


async def test_agent_kill_9_lost_then_fenced(patient_rm, agent_factory):
    rm = patient_rm
    agent = await start_agent(rm, agent_factory)
    kept = await create(rm)
    agent.kill()
    # Quick restart (before the expiry): the EngineConn is re-attached and kept.
    agent.start()
    await wait_until(
        lambda: f"re-attached EngineConn {kept.engine_conn_id}" in agent.log_text(),
        timeout=30,
        what=lambda: f"the re-attach; the agent's log:\n{agent.log_text()[-3000:]}",
    )
    reattached = datetime.now(UTC)
    # Heartbeats sent after the re-attach carry the EngineConn's process: the RM keeps
    # it (no kill command for a process it knows), and it still runs code.
    await wait_until(lambda: heard_after(rm, "agent1", reattached), timeout=30)
    answered = datetime.now(UTC)  # and one more, after the RM's answer to that one
    await wait_until(lambda: heard_after(rm, "agent1", answered), timeout=30)
    assert (await get_ec(rm, kept.engine_conn_id)).state == ec_pb.ENGINE_CONN_STATE_IDLE
    assert await execute(kept, "echo still here") == ("still here\n", "", 0)
    pid = os.getpgid((await get_ec(rm, kept.engine_conn_id)).pid)
    # Now stay away past the expiry: LOST, released; on return the process is killed.
    agent.kill()
    lost = await wait_until(lambda: ended(rm, kept.engine_conn_id), timeout=60)
    assert lost.state == ec_pb.ENGINE_CONN_STATE_LOST
    assert await ticket_state(rm, kept.ticket_id) == rm_pb.TICKET_STATE_RELEASED
    ecm = (await rm.rm.GetEcm(rm_pb.GetEcmRequest(instance="agent1"))).ecm
    assert ecm.state == rm_pb.ECM_STATE_LOST
    agent.start()
    await wait_until(lambda: _async(not group_members(pid)), timeout=30)
    await wait_until(lambda: agent_beating(rm.rm, "agent1"), timeout=30)
    await assert_consistent(rm)


async def test_excluded_host_refused_refresh_and_decommission(cluster_rm, agent_factory):
    rm = cluster_rm
    await rm.admin.RefreshNodes(admin_pb2.RefreshNodesRequest(exclude=["agent2"]))
    bad = agent_factory(rm.target, "agent2")
    bad.start()
    await wait_until(lambda: _async(bad.proc.poll() is not None), timeout=30)
    assert bad.proc.returncode == 3 and "not allowed" in bad.log_text()
    await refused(rm.rm.GetEcm(rm_pb.GetEcmRequest(instance="agent2")), grpc.StatusCode.NOT_FOUND)
    # Lift the exclusion at run time (no RM restart): the agent now gets in.
    await rm.admin.RefreshNodes(admin_pb2.RefreshNodesRequest())
    bad.start()
    await wait_until(lambda: agent_beating(rm.rm, "agent2"), timeout=30)
    ec = await create(rm)
    assert ec.ecm_instance == "agent2"
    live = await rm.admin.DecommissionEcm(admin_pb2.DecommissionEcmRequest(instance="agent2"))
    assert live.live_engine_conns == 1
    # Draining: no new EngineConns there (and it is the only ECM).
    err = await refused(create(rm), grpc.StatusCode.FAILED_PRECONDITION, "NO_ELIGIBLE_ECM")
    assert "agent2: " in (err.details() or "") and "DRAINING" in (err.details() or "")
    await ecs(rm).KillEngineConn(ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id))
    await wait_until(lambda: _async(bad.proc.poll() is not None), timeout=30)  # it left
    await refused(rm.rm.GetEcm(rm_pb.GetEcmRequest(instance="agent2")), grpc.StatusCode.NOT_FOUND)
    await assert_consistent(rm)


async def test_users_cannot_report_or_release_an_engineconns_ticket(cluster_rm, agent_factory):
    """The EngineConn's lifecycle owns its ticket: a user's Release (or ReportUsed) of
    it would hand out capacity the running EngineConn still uses. Refused
    FAILED_PRECONDITION naming KillEngineConn; nothing changes; KillEngineConn works."""
    rm = cluster_rm
    await start_agent(rm, agent_factory)
    ec = await create(rm)
    assert await ticket_state(rm, ec.ticket_id) == rm_pb.TICKET_STATE_USED
    before = await label_state(rm, "emInstance=agent1")
    for call in (
        rm.rm.Release(rm_pb.ReleaseRequest(ticket_id=ec.ticket_id)),
        rm.rm.ReportUsed(rm_pb.ReportUsedRequest(ticket_id=ec.ticket_id)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "KillEngineConn" in exc.value.details()
    assert await label_state(rm, "emInstance=agent1") == before
    assert await ticket_state(rm, ec.ticket_id) == rm_pb.TICKET_STATE_USED
    running = await get_ec(rm, ec.engine_conn_id)
    assert running.state == ec_pb.ENGINE_CONN_STATE_IDLE
    out, _, code = await execute(running, "echo still-here")
    assert (out.strip(), code) == ("still-here", 0)
    await ecs(rm).KillEngineConn(ec_pb.KillEngineConnRequest(engine_conn_id=ec.engine_conn_id))
    await wait_until(lambda: ended(rm, ec.engine_conn_id), timeout=20)
    assert await ticket_state(rm, ec.ticket_id) == rm_pb.TICKET_STATE_RELEASED
    await assert_consistent(rm)
