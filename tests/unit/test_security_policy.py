"""The access policy table and its checks, without a server."""

from __future__ import annotations

import pytest
from labelrm.v1 import (
    admin_pb2,
    demand_pb2,
    engine_conn_pb2,
    resource_manager_pb2,
    resource_pb2,
    usage_pb2,
)

from labelrm_common.roles import Role
from rm_server.errors import NotFound, PermissionDenied, Unauthenticated, not_found
from rm_server.security import policy
from rm_server.security.identity import (
    ANONYMOUS,
    DEV_ADMIN,
    Kind,
    Principal,
    from_token_entry,
)

SERVICES = [
    resource_manager_pb2.DESCRIPTOR.services_by_name["ResourceManagerService"],
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
    engine_conn_pb2.DESCRIPTOR.services_by_name["EngineConnService"],
    demand_pb2.DESCRIPTOR.services_by_name["DemandService"],
    usage_pb2.DESCRIPTOR.services_by_name["UsageService"],
]
ALL_METHODS = sorted(f"{s.full_name}/{m.name}" for s in SERVICES for m in s.methods)

ALICE = from_token_entry("alice", ["user"])
ADMIN = from_token_entry("root", ["admin"])
GATEWAY = from_token_entry("gateway", ["user"])
AGENT1 = Principal(Kind.AGENT, "agent1", frozenset({Role.AGENT}), frozenset({"node1"}))
EC1 = Principal(Kind.ENGINECONN, "ec-1", frozenset({Role.ENGINECONN}))


class FakeOwners:
    def __init__(self, **owners: str) -> None:
        self.owners = owners

    async def ticket_owner(self, ticket_id: str) -> str | None:
        return self.owners.get(ticket_id)

    async def engine_conn_owner(self, ec_id: str) -> str | None:
        return self.owners.get(ec_id)


OWNERS = FakeOwners(**{"t-bob": "bob", "t-alice": "alice", "ec-bob": "bob"})


def test_every_rpc_has_exactly_one_rule():
    assert sorted(policy.POLICY) == ALL_METHODS


@pytest.mark.parametrize("method", ALL_METHODS)
def test_rule_fields_exist_on_the_request(method):
    rule = policy.POLICY[method]
    service, name = method.split("/")
    desc = next(s for s in SERVICES if s.full_name == service).methods_by_name[name]
    if rule.check is not policy.Check.NONE:
        message = desc.input_type
        *outer, last = rule.field.split(".")  # a dotted path into nested messages
        for name in outer:
            message = message.fields_by_name[name].message_type
        assert last in message.fields_by_name, (method, rule.field)
    # Only calls whose client streams are checked message by message, and those must be.
    assert rule.per_message == desc.client_streaming, method


async def test_admin_and_dev_mode_may_call_everything():
    for method in ALL_METHODS:
        for who in (ADMIN, DEV_ADMIN):
            await policy.authorize(method, who, object(), OWNERS)


async def test_anonymous_is_unauthenticated_and_public_methods_are_open():
    with pytest.raises(Unauthenticated):
        await policy.authorize(policy.RM + "ListEcms", ANONYMOUS, None, OWNERS)
    assert await policy.authorize("grpc.health.v1.Health/Check", ANONYMOUS, None, OWNERS) is None


async def test_unknown_rpc_is_denied_to_all_but_admins():
    with pytest.raises(PermissionDenied, match="no access rule"):
        await policy.authorize("labelrm.v1.ResourceManagerService/New", ALICE, None, OWNERS)
    await policy.authorize("labelrm.v1.ResourceManagerService/New", ADMIN, None, OWNERS)


async def test_roles():
    with pytest.raises(PermissionDenied, match="needs role admin"):
        await policy.authorize(policy.ADMIN + "SetLabelLimit", ALICE, None, OWNERS)
    with pytest.raises(PermissionDenied, match="needs role agent"):
        req = resource_manager_pb2.HeartbeatRequest(agent_id="alice")
        await policy.authorize(policy.RM + "Heartbeat", ALICE, req, OWNERS)
    with pytest.raises(PermissionDenied, match="needs role user"):
        req = resource_manager_pb2.ApplyRequest()
        await policy.authorize(policy.RM + "Apply", AGENT1, req, OWNERS)


async def test_agents_act_only_as_themselves():
    for agent_id in ("agent1", "node1"):  # CN or DNS SAN
        req = resource_manager_pb2.HeartbeatRequest(agent_id=agent_id)
        await policy.authorize(policy.RM + "Heartbeat", AGENT1, req, OWNERS)
    for method, req in (
        ("Heartbeat", resource_manager_pb2.HeartbeatRequest(agent_id="agent2")),
        ("RegisterEcm", resource_manager_pb2.RegisterEcmRequest(instance="agent2")),
        ("UnregisterEcm", resource_manager_pb2.UnregisterEcmRequest(instance="agent2")),
        ("Heartbeat", resource_manager_pb2.HeartbeatRequest(agent_id="")),
    ):
        with pytest.raises(PermissionDenied, match="may not act as"):
            await policy.authorize(policy.RM + method, AGENT1, req, OWNERS)
    stream = engine_conn_pb2.StreamAgentCommandsRequest(agent_id="agent2")
    with pytest.raises(PermissionDenied):
        await policy.authorize(policy.EC + "StreamAgentCommands", AGENT1, stream, OWNERS)
    # Another agent's ECM: only an admin may unregister it.
    req = resource_manager_pb2.UnregisterEcmRequest(instance="agent2")
    await policy.authorize(policy.RM + "UnregisterEcm", ADMIN, req, OWNERS)


async def test_engineconns_report_only_themselves():
    own = engine_conn_pb2.ReportEngineConnStateRequest(engine_conn_id="ec-1")
    await policy.authorize(policy.EC + "ReportEngineConnState", EC1, own, OWNERS)
    other = engine_conn_pb2.ReportEngineConnStateRequest(engine_conn_id="ec-2")
    with pytest.raises(PermissionDenied):
        await policy.authorize(policy.EC + "ReportEngineConnState", EC1, other, OWNERS)
    with pytest.raises(PermissionDenied):
        await policy.authorize(policy.EC + "ReportEngineConnState", AGENT1, own, OWNERS)


def _labels(text: str) -> list[resource_pb2.Label]:
    return [resource_pb2.Label(key=k, value=v) for k, v in (p.split("=") for p in text.split(","))]


async def test_apply_is_forced_to_the_caller():
    req = resource_manager_pb2.ApplyRequest(labels=_labels("userCreator=alice-IDE,engineType=x-1"))
    await policy.authorize(policy.RM + "Apply", ALICE, req, OWNERS)
    assert req.user == "alice"  # filled in
    for bad in (
        resource_manager_pb2.ApplyRequest(user="bob"),
        resource_manager_pb2.ApplyRequest(labels=_labels("userCreator=bob-IDE,engineType=x-1")),
    ):
        with pytest.raises(PermissionDenied):
            await policy.authorize(policy.RM + "Apply", ALICE, bad, OWNERS)
    # A malformed label is left to the servicer (INVALID_ARGUMENT there).
    odd = resource_manager_pb2.ApplyRequest(labels=_labels("userCreator=nodash"))
    await policy.authorize(policy.RM + "Apply", ALICE, odd, OWNERS)


@pytest.mark.parametrize("method", [policy.RM + "Apply", policy.DEMAND + "SubmitDemand"])
async def test_users_apply_only_on_labels_that_charge_them(method):
    request_type = (
        resource_manager_pb2.ApplyRequest
        if method.endswith("Apply")
        else demand_pb2.SubmitDemandRequest
    )
    for labels in ("emInstance=agent1", "userCreator=alice-IDE,emInstance=agent1"):
        with pytest.raises(PermissionDenied) as err:
            await policy.authorize(method, ALICE, request_type(labels=_labels(labels)), OWNERS)
        assert err.value.reason == "OWN_LABELS_REQUIRED"
    own = "userCreator=alice-IDE,engineType=x-1,emInstance=agent1"
    await policy.authorize(method, ALICE, request_type(labels=_labels(own)), OWNERS)
    # A proxy user acts for the one user of the labels; admins may apply on anything.
    bobs = "userCreator=bob-IDE,engineType=x-1"
    for labels, ok in (
        (bobs, True),
        ("emInstance=agent1", False),
        (bobs + ",userCreator=x-y", False),
    ):
        request = request_type(labels=_labels(labels))
        if ok:
            await policy.authorize(method, GATEWAY, request, OWNERS, proxy_users={"gateway"})
            continue
        with pytest.raises(PermissionDenied):
            await policy.authorize(method, GATEWAY, request, OWNERS, proxy_users={"gateway"})
    await policy.authorize(method, ADMIN, request_type(labels=_labels("emInstance=a")), OWNERS)


async def test_engineconn_creation_as_another_user_needs_admin_or_proxy():
    def req(user: str = "", creator: str = "bob") -> engine_conn_pb2.CreateEngineConnRequest:
        return engine_conn_pb2.CreateEngineConnRequest(
            user=user, labels=_labels(f"userCreator={creator}-IDE,engineType=shell-1")
        )

    for bad in (req(), req(user="bob"), req(user="alice")):
        with pytest.raises(PermissionDenied):
            await policy.authorize(policy.EC + "CreateEngineConn", ALICE, bad, OWNERS)
    await policy.authorize(policy.EC + "CreateEngineConn", ALICE, req(creator="alice"), OWNERS)
    for method in ("CreateEngineConn", "AskEngineConn"):
        ok = req(user="bob")
        await policy.authorize(policy.EC + method, GATEWAY, ok, OWNERS, proxy_users={"gateway"})
        assert ok.user == "bob"
    await policy.authorize(policy.EC + "CreateEngineConn", ADMIN, req(), OWNERS)


async def test_lists_are_filtered_to_the_caller():
    for method, request_type in (
        (policy.RM + "ListTickets", resource_manager_pb2.ListTicketsRequest),
        (policy.EC + "ListEngineConns", engine_conn_pb2.ListEngineConnsRequest),
        (policy.DEMAND + "ListDemands", demand_pb2.ListDemandsRequest),
    ):
        req = request_type()
        await policy.authorize(method, ALICE, req, OWNERS)
        assert req.user == "alice"
        with pytest.raises(PermissionDenied):
            await policy.authorize(method, ALICE, request_type(user="bob"), OWNERS)
        everyone = request_type()
        await policy.authorize(method, ADMIN, everyone, OWNERS)
        assert everyone.user == ""


@pytest.mark.parametrize(
    ("method", "request_type", "field", "foreign"),
    [
        (policy.RM + "Release", resource_manager_pb2.ReleaseRequest, "ticket_id", "t-bob"),
        (policy.RM + "ReportUsed", resource_manager_pb2.ReportUsedRequest, "ticket_id", "t-bob"),
        (policy.RM + "GetTicket", resource_manager_pb2.GetTicketRequest, "ticket_id", "t-bob"),
        (
            policy.EC + "KillEngineConn",
            engine_conn_pb2.KillEngineConnRequest,
            "engine_conn_id",
            "ec-bob",
        ),
        (
            policy.EC + "GetEngineConn",
            engine_conn_pb2.GetEngineConnRequest,
            "engine_conn_id",
            "ec-bob",
        ),
    ],
)
async def test_objects_of_another_user_are_off_limits(method, request_type, field, foreign):
    with pytest.raises(NotFound) as err:
        await policy.authorize(method, ALICE, request_type(**{field: foreign}), OWNERS)
    # Word for word what an id nobody has gets (never another tenant's name either).
    kind = "ticket" if field == "ticket_id" else "EngineConn"
    assert err.value.message == not_found(kind, foreign).message
    assert err.value.reason == not_found(kind, "nope").reason
    # Unknown ids pass (the servicer answers NOT_FOUND); owners, admins and proxies pass.
    await policy.authorize(method, ALICE, request_type(**{field: "nope"}), OWNERS)
    await policy.authorize(
        method, from_token_entry("bob", ["user"]), request_type(**{field: foreign}), OWNERS
    )
    await policy.authorize(method, ADMIN, request_type(**{field: foreign}), OWNERS)
    proxied = request_type(**{field: foreign})
    await policy.authorize(method, GATEWAY, proxied, OWNERS, proxy_users={"gateway"})


@pytest.mark.parametrize(
    "request_type",
    [demand_pb2.GetDemandRequest, demand_pb2.CancelDemandRequest, demand_pb2.ClaimDemandRequest],
)
async def test_demands_are_looked_up_among_the_callers_own(request_type):
    """Demand ids are per user: the request is scoped to the caller (another user's demand
    of that id is then NOT_FOUND at the servicer); naming another user needs admin/proxy."""
    method = policy.DEMAND + request_type.DESCRIPTOR.name.removesuffix("Request")
    mine = request_type(demand_id="d1")
    await policy.authorize(method, ALICE, mine, OWNERS)
    assert mine.user == "alice"
    with pytest.raises(PermissionDenied) as err:
        await policy.authorize(method, ALICE, request_type(demand_id="d1", user="bob"), OWNERS)
    assert "bob" not in err.value.message
    proxied = request_type(demand_id="d1", user="bob")
    await policy.authorize(method, GATEWAY, proxied, OWNERS, proxy_users={"gateway"})
    anyone = request_type(demand_id="d1")
    await policy.authorize(method, ADMIN, anyone, OWNERS)
    assert anyone.user == ""  # an admin's look-up by id alone


async def test_apply_like_rules_are_the_ones_that_allocate():
    apply_like = sorted(m for m, r in policy.POLICY.items() if r.apply_like)
    assert apply_like == sorted(
        [
            policy.RM + "Apply",
            policy.EC + "CreateEngineConn",
            policy.EC + "AskEngineConn",
            policy.DEMAND + "SubmitDemand",
        ]
    )


async def test_a_streamed_call_opens_on_the_role_and_each_message_is_checked():
    method = policy.RM + "HeartbeatStream"
    rule = await policy.authorize(method, AGENT1, None, OWNERS)
    assert rule is not None and rule.per_message
    with pytest.raises(PermissionDenied):
        await policy.authorize(method, ALICE, None, OWNERS)  # the role, before any message
    own = resource_manager_pb2.HeartbeatStreamRequest(
        heartbeat=resource_manager_pb2.HeartbeatRequest(agent_id="agent1", sequence=1)
    )
    assert await policy.authorize(method, AGENT1, own, OWNERS) is rule
    other = resource_manager_pb2.HeartbeatStreamRequest(
        heartbeat=resource_manager_pb2.HeartbeatRequest(agent_id="agent2", sequence=1)
    )
    with pytest.raises(PermissionDenied, match=r"heartbeat\.agent_id 'agent2'"):
        await policy.authorize(method, AGENT1, other, OWNERS)


async def test_a_missing_request_passes_no_ownership_check_but_a_streamed_one():
    # Fail closed: only a per_message rule admits a call before its messages are seen.
    with pytest.raises(PermissionDenied, match="without a request"):
        await policy.authorize(policy.RM + "Heartbeat", AGENT1, None, OWNERS)
