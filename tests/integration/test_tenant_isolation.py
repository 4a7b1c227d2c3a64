"""Tenant isolation on a secured deployment (TLS, tokens, roles, the mutual-TLS agent
listener): two users, each the other's adversary, attack through request ids, labels
that skip their limits, demand ids and refusal messages. Each test reproduces the
attack as a hostile tenant would run it and asserts that it fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import demand_pb2 as demand_pb
from labelrm.v1 import engine_conn_pb2 as ec_pb
from labelrm.v1 import resource_manager_pb2 as pb

from tests.integration.security_fixtures import (
    engine_conn_of,
    make_pki,
    secure_cluster,
    start_secure,
    start_secure_agent,
    stop_secure,
)
from tests.support.messages import GiB, apply_req, lbl, limit_req, load_instance, register
from tests.support.refusals import reason_of
from tests.support.rm import label_state

SHELL_A = "userCreator=lrmtest_a-IDE,engineType=shell-1"
SHELL_B = "userCreator=lrmtest_b-IDE,engineType=shell-1"


@pytest.fixture
async def cluster(database_url, tmp_path, sudo_users):
    """The secured RM, with tokens for the two sudo test users."""
    async with secure_cluster(database_url, tmp_path, sudo_users) as srm:
        yield srm


async def refused(call, request) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(request, timeout=60)
    return err.value


# ----- request ids are the caller's own ------------------------------------------------------


async def test_another_users_request_id_is_a_new_engineconn(cluster, agent_factory):
    """B replays A's CreateEngineConn / AskEngineConn request id: B gets an EngineConn of
    its own (running as B), never A's EngineConn or its executor secret."""
    await start_secure_agent(cluster, agent_factory)
    alice = cluster.stubs(cluster.channel("lrmtest_a"))
    bob = cluster.stubs(cluster.channel("lrmtest_b"))
    timeout = Duration(seconds=30)
    mine = ec_pb.CreateEngineConnRequest(
        request_id="shared-id", labels=lbl(SHELL_A), timeout=timeout
    )
    a_ec = (await alice.ecs.CreateEngineConn(mine, timeout=60)).engine_conn
    assert a_ec.user == "lrmtest_a" and a_ec.secret

    theirs = ec_pb.CreateEngineConnRequest(
        request_id="shared-id", labels=lbl(SHELL_B), timeout=timeout
    )
    b_ec = (await bob.ecs.CreateEngineConn(theirs, timeout=60)).engine_conn
    assert b_ec.engine_conn_id != a_ec.engine_conn_id
    assert b_ec.user == "lrmtest_b" and b_ec.secret != a_ec.secret

    ask = ec_pb.AskEngineConnRequest(request_id="shared-id", labels=lbl(SHELL_B), timeout=timeout)
    asked = (await bob.ecs.AskEngineConn(ask, timeout=60)).engine_conn
    assert asked.engine_conn_id != a_ec.engine_conn_id and asked.secret != a_ec.secret

    # B cannot reach A's EngineConn by its id either: for B it does not exist.
    get = ec_pb.GetEngineConnRequest(engine_conn_id=a_ec.engine_conn_id)
    err = await refused(bob.ecs.GetEngineConn, get)
    assert err.code() == grpc.StatusCode.NOT_FOUND and "lrmtest_a" not in err.details()
    # The owner's retry is a replay: the same EngineConn, its secret included.
    again = (await alice.ecs.CreateEngineConn(mine, timeout=60)).engine_conn
    assert again.engine_conn_id == a_ec.engine_conn_id and again.secret == a_ec.secret
    # The owner reusing the id for another request is refused, and changes nothing.
    other = ec_pb.CreateEngineConnRequest(
        request_id="shared-id", labels=lbl(SHELL_A), timeout=Duration(seconds=29)
    )
    err = await refused(alice.ecs.CreateEngineConn, other)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(err) == "REQUEST_ID_REUSED"
    listed = (await alice.ecs.ListEngineConns(ec_pb.ListEngineConnsRequest())).engine_conns
    assert [e.engine_conn_id for e in listed] == [a_ec.engine_conn_id]
    for stubs, ec_id in {
        (alice, a_ec.engine_conn_id),
        (bob, b_ec.engine_conn_id),
        (bob, asked.engine_conn_id),
    }:
        await stubs.ecs.KillEngineConn(ec_pb.KillEngineConnRequest(engine_conn_id=ec_id))


# ----- users apply under their own limits ----------------------------------------------------


@pytest.fixture
async def srm(database_url, tmp_path):
    """The secured RM with one ECM (8 instances) and a limit of two instances per user."""
    rm = await start_secure(database_url, make_pki(tmp_path / "pki"))
    admin = rm.stubs(rm.channel("root"))
    await admin.rm.RegisterEcm(register("agent1", load_instance(8 * GiB, 8000, 8)))
    await admin.admin.SetLabelLimit(
        limit_req("userCreator=*,engineType=*", load_instance(2 * GiB, 2000, 2))
    )
    try:
        yield rm
    finally:
        await stop_secure(rm)


async def test_users_cannot_apply_past_their_limits_on_infrastructure_labels(srm):
    """Bob applies on `emInstance=agent1` alone (and with a userCreator that forms no
    limited combination): before, that charged the ECM only, so his limit of one instance
    never applied. Now a user's Apply and SubmitDemand must charge their own label."""
    bob = srm.stubs(srm.channel("bob"))
    admin = srm.stubs(srm.channel("root"))
    four = load_instance(4 * GiB, 4000, 4)
    for labels in ("emInstance=agent1", "userCreator=bob-IDE,emInstance=agent1"):
        err = await refused(bob.rm.Apply, apply_req(labels, four))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, labels
        assert reason_of(err) == "OWN_LABELS_REQUIRED" and "userCreator" in err.details()
        submit = demand_pb.SubmitDemandRequest(demand_id="d1", labels=lbl(labels), resource=four)
        err = await refused(bob.demands.SubmitDemand, submit)
        assert reason_of(err) == "OWN_LABELS_REQUIRED"
    # Nothing was charged, and with his own labels his limit applies.
    assert (await bob.rm.ListTickets(pb.ListTicketsRequest())).tickets == []
    assert (await label_state(admin, "emInstance=agent1")).live_tickets == 0
    own = "userCreator=bob-IDE,engineType=spark-3.2.1,emInstance=agent1"
    err = await refused(bob.rm.Apply, apply_req(own, four))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    ticket = (await bob.rm.Apply(apply_req(own, load_instance(GiB, 1000, 1)))).ticket
    assert ticket.user == "bob"
    # Operators may still apply on infrastructure labels alone.
    await admin.rm.Apply(apply_req("emInstance=agent1", four))


# ----- another user's objects do not exist for a user ------------------------------------------


async def test_another_users_ids_answer_as_unknown_ids(srm):
    """Bob names Alice's ticket and EngineConn: he gets word for word what an id nobody
    has gets (a PERMISSION_DENIED here told him which ids exist), and nothing changes."""
    alice = srm.stubs(srm.channel("alice"))
    bob = srm.stubs(srm.channel("bob"))
    admin = srm.stubs(srm.channel("root"))
    labels = "userCreator=alice-IDE,engineType=spark-3.2.1,emInstance=agent1"
    ticket = (await alice.rm.Apply(apply_req(labels, load_instance(GiB, 1000, 1)))).ticket
    await engine_conn_of(srm, "ec-of-alice", "alice")
    probes: list[tuple[Any, Callable[[str], Any], str]] = [
        (bob.rm.GetTicket, lambda i: pb.GetTicketRequest(ticket_id=i), ticket.ticket_id),
        (bob.rm.ReportUsed, lambda i: pb.ReportUsedRequest(ticket_id=i), ticket.ticket_id),
        (bob.rm.Release, lambda i: pb.ReleaseRequest(ticket_id=i), ticket.ticket_id),
        (bob.ecs.GetEngineConn, lambda i: ec_pb.GetEngineConnRequest(engine_conn_id=i), "ec-of-alice"),
        (bob.ecs.KillEngineConn, lambda i: ec_pb.KillEngineConnRequest(engine_conn_id=i), "ec-of-alice"),
    ]  # fmt: skip
    for call, make, theirs in probes:
        unknown = theirs[:-3] + "zzz"  # an id of the same shape that nobody has
        hers, nobodys = await refused(call, make(theirs)), await refused(call, make(unknown))
        assert hers.code() == nobodys.code() == grpc.StatusCode.NOT_FOUND, hers.details()
        assert reason_of(hers) == reason_of(nobodys) == "NOT_FOUND"
        assert hers.details().replace(theirs, "ID") == nobodys.details().replace(unknown, "ID")
    # Nothing changed; Alice and the admins see her objects as before.
    get = pb.GetTicketRequest(ticket_id=ticket.ticket_id)
    assert (await alice.rm.GetTicket(get)).ticket.state == pb.TICKET_STATE_LOCKED
    ec = ec_pb.GetEngineConnRequest(engine_conn_id="ec-of-alice")
    assert (await alice.ecs.GetEngineConn(ec)).engine_conn.state == ec_pb.ENGINE_CONN_STATE_IDLE
    assert (await admin.ecs.GetEngineConn(ec)).engine_conn.user == "alice"


# ----- demand ids are per user ----------------------------------------------------------------

SPARK = "engineType=spark-3.2.1"


def demand(demand_id: str, user: str, when: str = "") -> demand_pb.SubmitDemandRequest:
    request = demand_pb.SubmitDemandRequest(
        demand_id=demand_id,
        labels=lbl(f"userCreator={user}-IDE,{SPARK}"),
        resource=load_instance(GiB, 1000, 1),
    )
    if when:
        request.time_conditions_text = when
    return request


async def test_demand_ids_are_per_user(srm):
    """Bob names Alice's demand ids: he cannot read, cancel or claim her demands, learn
    that they exist or whose they are, squat on her ids, or order his demands after hers
    (which told him their state). Each user's ids are their own."""
    alice = srm.stubs(srm.channel("alice"))
    bob = srm.stubs(srm.channel("bob"))
    admin = srm.stubs(srm.channel("root"))
    failed = (await alice.demands.SubmitDemand(demand("a-failed", "alice"))).demand
    await alice.demands.CancelDemand(demand_pb.CancelDemandRequest(demand_id=failed.demand_id))
    nightly = (await alice.demands.SubmitDemand(demand("nightly", "alice"))).demand
    assert nightly.user == "alice"
    for call, request in (
        (bob.demands.GetDemand, demand_pb.GetDemandRequest(demand_id="nightly")),
        (bob.demands.CancelDemand, demand_pb.CancelDemandRequest(demand_id="nightly")),
        (bob.demands.ClaimDemand, demand_pb.ClaimDemandRequest(demand_id="nightly")),
    ):
        err = await refused(call, request)
        assert err.code() == grpc.StatusCode.NOT_FOUND, call
        assert "alice" not in err.details()
        named = type(request)(demand_id="nightly", user="alice")
        err = await refused(call, named)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "alice" not in err.details()
    # The same id is Bob's own demand, not a replay of (or a clash with) Alice's.
    submitted = await bob.demands.SubmitDemand(demand("nightly", "bob"))
    assert submitted.created and submitted.demand.user == "bob"
    # His OrderBy names his own demands only: Alice's FAILED one does not fail his, it is
    # an id he has not submitted yet (so he waits for it).
    after = await bob.demands.SubmitDemand(demand("b2", "bob", "{OrderBy: a-failed}"))
    assert after.created and after.demand.state == demand_pb.DEMAND_STATE_ACCEPTED
    # Alice's demand is untouched; each lists only their own.
    got = (await alice.demands.GetDemand(demand_pb.GetDemandRequest(demand_id="nightly"))).demand
    assert got.user == "alice" and got.state != demand_pb.DEMAND_STATE_FAILED
    listed = (await bob.demands.ListDemands(demand_pb.ListDemandsRequest())).demands
    assert sorted((d.user, d.demand_id) for d in listed) == [("bob", "b2"), ("bob", "nightly")]
    # An operator names the user when two users have the id.
    err = await refused(admin.demands.GetDemand, demand_pb.GetDemandRequest(demand_id="nightly"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "user" in err.details()
    hers = demand_pb.GetDemandRequest(demand_id="nightly", user="alice")
    assert (await admin.demands.GetDemand(hers)).demand.user == "alice"
    everyone = demand_pb.ListDemandsRequest(page_size=1)
    seen = []
    while True:
        page = await admin.demands.ListDemands(everyone)
        seen += [(d.user, d.demand_id) for d in page.demands]
        if not page.next_page_token:
            break
        everyone.page_token = page.next_page_token
    assert seen == sorted(seen) and len(seen) == 4


@pytest.mark.parametrize("batch_max", [0, 256], ids=["one-by-one", "grouped"])
async def test_apply_report_release_request_ids_are_per_caller(database_url, tmp_path, batch_max):
    """Bob sends Apply, ReportUsed and Release under the request ids Alice used: each is
    his own new request (before, the shared id space refused them as reused, or replayed
    Alice's stored outcome). Alice's retries still replay hers; her reuse of an id for
    another request is refused."""
    rm = await start_secure(database_url, make_pki(tmp_path / "pki"), batch_max=batch_max)
    try:
        admin = rm.stubs(rm.channel("root"))
        await admin.rm.RegisterEcm(register("agent1", load_instance(8 * GiB, 8000, 8)))
        alice = rm.stubs(rm.channel("alice"))
        bob = rm.stubs(rm.channel("bob"))
        one = load_instance(GiB, 1000, 1)

        def own(user: str) -> str:
            return f"userCreator={user}-IDE,engineType=spark-3.2.1,emInstance=agent1"

        a_ticket = (await alice.rm.Apply(apply_req(own("alice"), one, "apply-1"))).ticket
        b_ticket = (await bob.rm.Apply(apply_req(own("bob"), one, "apply-1"))).ticket
        assert b_ticket.user == "bob" and b_ticket.ticket_id != a_ticket.ticket_id
        again = (await alice.rm.Apply(apply_req(own("alice"), one, "apply-1"))).ticket
        assert again.ticket_id == a_ticket.ticket_id  # her retry replays her outcome
        err = await refused(
            alice.rm.Apply, apply_req(own("alice"), load_instance(GiB, 1000, 2), "apply-1")
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(err) == "REQUEST_ID_REUSED"
        for stubs, ticket in ((alice, a_ticket), (bob, b_ticket)):
            used = pb.ReportUsedRequest(request_id="report-1", ticket_id=ticket.ticket_id)
            assert (await stubs.rm.ReportUsed(used)).ticket.state == pb.TICKET_STATE_USED
        for stubs, ticket in ((alice, a_ticket), (bob, b_ticket)):
            release = pb.ReleaseRequest(request_id="release-1", ticket_id=ticket.ticket_id)
            await stubs.rm.Release(release)
        listed = (await admin.rm.ListTickets(pb.ListTicketsRequest())).tickets
        assert listed == []  # both released: neither request was taken for the other's
        assert (await label_state(admin, "emInstance=agent1")).live_tickets == 0
    finally:
        await stop_secure(rm)
