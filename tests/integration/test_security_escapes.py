"""Text a tenant writes that other people read: control characters in free text reach
an admin's terminal (`rmctl describe`) and the console. The RM refuses them in every
user request, and rmctl writes out any that were stored anyway (an EngineConn's own
report, rows from before)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from labelrm.v1 import admin_pb2
from labelrm.v1 import demand_pb2 as demand_pb
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from tests.integration.security_fixtures import engine_conn_of, make_pki, start_secure, stop_secure
from tests.support.messages import GiB, lbl, load_instance, register
from tests.support.refusals import bad_field, refused

# Sets the terminal's title, rings, and clears the screen.
ESCAPES = "\x1b]0;you have been pwned\x07\x1b[2J"
SPARK = "userCreator=alice-IDE,engineType=spark-3.2.1"


@pytest.fixture
async def srm(database_url, tmp_path):
    rm = await start_secure(database_url, make_pki(tmp_path / "pki"))
    admin = rm.stubs(rm.channel("root"))
    await admin.rm.RegisterEcm(register("agent1", load_instance(8 * GiB, 8000, 8)))
    try:
        yield rm
    finally:
        await stop_secure(rm)


async def test_control_characters_in_free_text_are_refused(srm):
    """Alice kills her EngineConn with a reason that retitles and clears the terminal of
    whoever reads it, and sends control characters in other free text: each request is
    INVALID_ARGUMENT naming the field, and changes nothing."""
    alice = srm.stubs(srm.channel("alice"))
    admin = srm.stubs(srm.channel("root"))
    await engine_conn_of(srm, "ec-text", "alice")
    kill = ec_pb.KillEngineConnRequest(engine_conn_id="ec-text", reason="done" + ESCAPES)
    err = await refused(alice.ecs.KillEngineConn(kill), grpc.StatusCode.INVALID_ARGUMENT)
    assert bad_field(err) == "reason" and "U+001B" in err.details()
    assert "\x1b" not in err.details()  # the refusal quotes it written out
    get = ec_pb.GetEngineConnRequest(engine_conn_id="ec-text")
    assert (await alice.ecs.GetEngineConn(get)).engine_conn.state == ec_pb.ENGINE_CONN_STATE_IDLE
    events = admin_pb2.ListEventsRequest(kind="engineconn", id="ec-text")
    assert all(e.reason != kill.reason for e in (await admin.admin.ListEvents(events)).events)

    submit = demand_pb.SubmitDemandRequest(
        demand_id="nightly", labels=lbl(SPARK), resource=load_instance(GiB, 1000, 1)
    )
    before = (await alice.demands.SubmitDemand(submit)).demand
    bidi = "\u202egpj.exe"  # shows as "exe.jpg"
    probes = [
        (alice.demands.CancelDemand, demand_pb.CancelDemandRequest(demand_id="nightly", reason=bidi), "reason"),
        (alice.demands.SubmitDemand, demand_pb.SubmitDemandRequest(
            demand_id="d\r1", labels=lbl(SPARK), resource=load_instance(GiB, 1000, 1)), "demand_id"),
        (alice.ecs.CreateEngineConn, ec_pb.CreateEngineConnRequest(
            labels=lbl("userCreator=alice-IDE,engineType=shell-1"), params={"memory": "1\x9b2J"}),
         "params.memory"),
        (alice.ecs.CreateEngineConn, ec_pb.CreateEngineConnRequest(
            request_id="r\x001", labels=lbl("userCreator=alice-IDE,engineType=shell-1")),
         "request_id"),
        (alice.rm.ListTickets, pb.ListTicketsRequest(label="x\x1b[1m"), "label"),
    ]  # fmt: skip
    for call, request, field in probes:
        err = await refused(call(request), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
        assert bad_field(err) == field, err.details()
    demand = demand_pb.GetDemandRequest(demand_id="nightly")
    got = (await alice.demands.GetDemand(demand)).demand
    assert (got.state, got.reason) == (before.state, before.reason)
    # Written text keeps its line breaks: a time condition may span lines.
    multiline = demand_pb.SubmitDemandRequest(
        demand_id="weekly", labels=lbl(SPARK), resource=load_instance(GiB, 1000, 1),
        time_conditions_text="{Start:\n\t[+1h, +2h]}",
    )  # fmt: skip
    await alice.demands.SubmitDemand(multiline)


async def test_rmctl_writes_stored_control_characters_out(srm, capsys):
    """Alice's EngineConn reports its end with the escapes in its reason (its certificate
    is in her work directory, so she can): stored as sent, `rmctl describe engineconn`
    shows the admin every one written out, and none reaches the terminal."""
    from rmctl import main

    cert = await engine_conn_of(srm, "ec-text", "alice")
    ec = srm.stubs(srm.channel(cert=cert, agent_port=True))
    report = ec_pb.ReportEngineConnStateRequest(
        engine_conn_id="ec-text",
        state=ec_pb.ENGINE_CONN_STATE_FAILED,
        reason="boom" + ESCAPES + "\u202e",
    )
    await ec.ecs.ReportEngineConnState(report, timeout=30)
    admin = ["--rm", srm.user_target, "--tls-ca", srm.pki.ca, "--token", srm.pki.tokens["root"]]
    for command in (
        ["describe", "engineconn", "ec-text"],
        ["engineconn", "list", "-A", "-o", "wide"],
    ):
        assert await asyncio.to_thread(main, [*admin, *command]) == 0
        out = capsys.readouterr().out
        for char in ("\x1b", "\x07", "\u202e"):
            assert char not in out, (command, out)
        if command[0] == "describe":
            assert "boom\\x1b]0;you have been pwned\\x07\\x1b[2J\\u202e" in out, out
    assert (
        await asyncio.to_thread(main, [*admin, "-o", "json", "engineconn", "status", "ec-text"])
        == 0
    )
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\u001b]0;you have been pwned" in out
