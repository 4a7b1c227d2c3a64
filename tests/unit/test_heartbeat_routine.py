"""The rule that decides whether an agent's heartbeat is answered in its group or
needs the full pass, and what the full pass attends to (rm_server/domain/engineconn.py:
needs_attention, any_vanished; rm_server/domain/heartbeats.py: answer_heartbeat)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.engineconn import EcmState, ProcessReport, ProcessState
from rm_server.domain.heartbeats import AgentSeen, Beat, BeatAnswer, Reply, answer_heartbeat

RUNNING = ProcessState.RUNNING


def run(ec_id: str, pid: int = 0) -> ProcessReport:
    return ProcessReport(ec_id, RUNNING, pid=pid)


def answer(reports: Sequence[ProcessReport], live: dict[str, int], acked: set[str]) -> BeatAnswer:
    """The answer to a new beat of a RUNNING agent the RM knows."""
    agent = AgentSeen(EcmState.RUNNING, 4, b"old", dict(live), set(acked))
    return answer_heartbeat(Beat("a", 5, tuple(reports), ()), agent, True)


def routine(reports: Sequence[ProcessReport], live: dict[str, int], acked: set[str]) -> bool:
    return answer(reports, live, acked).reply is Reply.OUTCOME


def test_no_processes_and_nothing_live_is_routine():
    assert routine([], {}, set())


def test_known_running_processes_with_their_pids_are_routine():
    live = {"ec1": 11, "ec2": 0}
    assert routine([run("ec1", 11), run("ec2")], live, {"ec1", "ec2"})


def test_each_reason_for_the_full_pass():
    live = {"ec1": 11}
    assert not routine([run("ec9", 99)], live, set())  # unknown: kill it
    assert not routine([run("ec1", 12)], live, {"ec1"})  # new pid: record
    assert not routine([run("ec2", 5)], {"ec2": 0}, set())  # first pid
    ended = ProcessReport("ec1", ProcessState.EXITED, pid=11, exit_code=0)
    assert not routine([ended], live, {"ec1"})  # ended: release it
    assert not routine([], live, {"ec1"})  # acknowledged, not reported: lost


def test_a_launch_not_yet_acknowledged_need_not_be_reported():
    assert routine([], {"ec1": 0}, set())


def test_the_full_pass_attends_only_to_the_processes_that_need_it():
    live = {"ec1": 11, "ec2": 0, "ec3": 0}
    reports = [run("ec1", 11), run("ec2", 21), run("ec3"), run("ec9", 99)]
    full = answer(reports, live, {"ec1"})
    assert full.reply is Reply.FULL_PASS
    assert [r.ec_id for r in full.attend] == ["ec2", "ec9"]  # a pid to record; unknown
    assert not full.fence
    vanished = answer([run("ec2", 21)], live, {"ec1"})
    assert vanished.fence and [r.ec_id for r in vanished.attend] == ["ec2"]


def test_a_draining_agent_gets_the_full_pass_with_nothing_else_to_do():
    agent = AgentSeen(EcmState.DRAINING, 4, b"old", {"ec1": 11}, {"ec1"})
    full = answer_heartbeat(Beat("a", 5, (run("ec1", 11),), ()), agent, True)
    assert full.reply is Reply.FULL_PASS and full.attend == () and not full.fence


ids = st.sampled_from(["ec1", "ec2", "ec3", "ec4"])


@given(
    st.dictionaries(ids, st.integers(0, 3)),
    st.sets(ids),
    st.lists(st.tuples(ids, st.sampled_from(list(ProcessState)), st.integers(0, 3))),
)
def test_the_full_pass_acts_on_exactly_what_would_change(live, acked, raw):
    reports = [ProcessReport(e, state, pid=pid) for e, state, pid in raw]
    got = answer(reports, live, acked)
    # What the full pass acts on (rm_server/app/agents.py): any report not RUNNING, an
    # unknown process, a pid to record; an acknowledged live EngineConn not reported.
    acts_on = [
        r
        for r in reports
        if r.state is not RUNNING or r.ec_id not in live or (r.pid and r.pid != live[r.ec_id])
    ]
    fence = any(e in live and e not in {r.ec_id for r in reports} for e in acked)
    assert (got.reply is Reply.OUTCOME) == (not acts_on and not fence)
    if got.reply is Reply.FULL_PASS:
        assert list(got.attend) == acts_on and got.fence == fence


# ----- the answer to a beat (rm_server/domain/heartbeats.py) ----------------------------------


def test_each_answer_to_a_beat_and_what_is_recorded():
    from rm_server.domain.engineconn import (
        AgentCommand,
        CommandKind,
        EcmState,
        HeartbeatAction,
        MeasuredUsage,
    )
    from rm_server.domain.heartbeats import AgentSeen, Beat, Reply, answer_heartbeat

    kill = AgentCommand("c1", "a", "ec1", CommandKind.KILL)
    done = AgentCommand("c2", "a", "ec2", CommandKind.KILL)
    usage = MeasuredUsage(memory_bytes=1, cpu_millis=2)
    beat = Beat("a", 5, (ProcessReport("ec1", RUNNING, pid=11, usage=usage),), ("c2",))
    agent = AgentSeen(EcmState.RUNNING, 4, b"old", {"ec1": 11}, {"ec1"}, [kill, done])

    unknown = answer_heartbeat(beat, None, True)
    assert unknown.reply is Reply.OUTCOME and not unknown.record
    assert unknown.outcome is not None and unknown.outcome.action is HeartbeatAction.REREGISTER

    routine = answer_heartbeat(beat, agent, True)
    assert routine.reply is Reply.OUTCOME and routine.record and routine.keep_outcome
    assert routine.outcome is not None and routine.outcome.action is HeartbeatAction.CONTINUE
    assert routine.outcome.commands == (kill,)  # the acknowledged one is not sent again
    assert routine.measured == (("ec1", usage),)

    excluded = answer_heartbeat(beat, agent, False)
    assert excluded.outcome is not None and excluded.outcome.action is HeartbeatAction.SHUTDOWN
    assert excluded.record and not excluded.keep_outcome and excluded.measured == ()

    resend = answer_heartbeat(Beat("a", 4, (), ()), agent, True)
    assert resend.reply is Reply.RESEND and not resend.record
    lost = AgentSeen(EcmState.LOST, 4, b"old")
    assert answer_heartbeat(beat, lost, True).outcome.action is HeartbeatAction.REREGISTER  # type: ignore[union-attr]
    assert not answer_heartbeat(beat, lost, False).record  # LOST: it must register again

    new_pid = Beat("a", 5, (ProcessReport("ec1", RUNNING, pid=12),), ())
    full = answer_heartbeat(new_pid, agent, True)
    assert full.reply is Reply.FULL_PASS and full.record and full.outcome is None
