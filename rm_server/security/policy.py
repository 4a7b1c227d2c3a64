"""THE access policy: one table naming, for every RPC the RM serves, who may call it
and how ownership is checked. Nothing else in the server decides who may do what.

Roles: ``user`` (people and their tools, with a token), ``agent`` (ECM agents, with a
certificate or a token), ``engineconn`` (an EngineConn, with the certificate the RM
issued it), ``admin`` (operators, with a token). An admin may call everything and
passes every ownership check. A ``proxy user`` (setting ``proxy_users``: a gateway that
submits on behalf of others) may act as any user on the user RPCs, without admin RPCs.

Ownership checks (`Check`), run before the servicer sees the request (on a call whose
client streams its requests, ``per_message``: before it sees each message; the call
itself is admitted on the role alone):

- SELF: the request's agent id / EngineConn id must be one of the caller's identities.
- ACT_AS: the request's ``user`` and the user of every ``userCreator`` label must be the
  caller; an empty ``user`` is filled in with the caller. With ``own_labels`` (Apply,
  SubmitDemand) the labels must also charge the acting user's own label (a
  ``userCreator`` combination of the label rules), so that their limits apply: a user
  may not apply on infrastructure labels (``emInstance``) alone (OWN_LABELS_REQUIRED).
- OWN_LIST: a list's ``user`` filter is forced to the caller.
- OWN_TICKET / OWN_ENGINE_CONN: the named object must belong to the caller. Another
  user's is NOT_FOUND, word for word what an id nobody has gets: a PERMISSION_DENIED
  there told a user which ids exist. An unknown id passes through, so the servicer
  answers NOT_FOUND as usual (or replays the outcome stored under a request id).

Demand ids are chosen by clients and are per user, so the demand RPCs are ACT_AS on the
request's ``user``: a user only ever looks among their own demands, and another user's
demand of the same id is NOT_FOUND (it does not exist for them).

A refusal names the caller and what they asked for, never another user.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from labelrm_common.roles import Role
from rm_server.domain.labels import (
    DEFAULT_RULES,
    MAX_LABELS,
    USER_CREATOR,
    Label,
    LabelError,
    TransformRule,
    charges_user,
    user_rule_keys,
)
from rm_server.domain.text import clip
from rm_server.errors import PermissionDenied, Unauthenticated, not_found
from rm_server.security.identity import Kind, Principal

log = logging.getLogger(__name__)

RM = "labelrm.v1.ResourceManagerService/"
ADMIN = "labelrm.v1.AdminService/"
EC = "labelrm.v1.EngineConnService/"
DEMAND = "labelrm.v1.DemandService/"
USAGE = "labelrm.v1.UsageService/"
# Open to anyone, authenticated or not: health checks (load balancers, probes) and
# reflection (grpcurl; it describes the API, never data).
PUBLIC_PREFIXES = ("grpc.health.v1.", "grpc.reflection.")


class Check(StrEnum):
    NONE = "none"
    SELF = "self"
    ACT_AS = "act_as"
    OWN_LIST = "own_list"
    OWN_TICKET = "own_ticket"
    OWN_ENGINE_CONN = "own_engine_conn"


@dataclass(frozen=True)
class Rule:
    """Who may call one RPC. `roles` never needs to list admin (admins may call all);
    `field` is the request field the check reads (a dotted path into a nested message);
    `apply_like` RPCs count against the per-user Apply rate (limits.py); `per_message`:
    the client streams requests, and the check runs on each of them; `own_labels`: the
    request's labels must charge the acting user (ACT_AS only)."""

    roles: frozenset[Role]
    check: Check = Check.NONE
    field: str = ""
    apply_like: bool = False
    per_message: bool = False
    own_labels: bool = False


_USER = frozenset({Role.USER})
_AGENT = frozenset({Role.AGENT})
_ENGINECONN = frozenset({Role.ENGINECONN})
_ADMIN_ONLY: frozenset[Role] = frozenset()

POLICY: Mapping[str, Rule] = {
    # ECM agents: each only as itself (the id is checked against its certificate).
    RM + "RegisterEcm": Rule(_AGENT, Check.SELF, "instance"),
    RM + "UnregisterEcm": Rule(_AGENT, Check.SELF, "instance"),  # another's: admin
    RM + "Heartbeat": Rule(_AGENT, Check.SELF, "agent_id"),
    RM + "HeartbeatStream": Rule(_AGENT, Check.SELF, "heartbeat.agent_id", per_message=True),
    EC + "StreamAgentCommands": Rule(_AGENT, Check.SELF, "agent_id"),
    # EngineConns: report only their own state.
    EC + "ReportEngineConnState": Rule(_ENGINECONN, Check.SELF, "engine_conn_id"),
    # Users: their own tickets, EngineConns and demands.
    RM + "Apply": Rule(_USER, Check.ACT_AS, "user", apply_like=True, own_labels=True),
    RM + "ReportUsed": Rule(_USER, Check.OWN_TICKET, "ticket_id"),
    RM + "Release": Rule(_USER, Check.OWN_TICKET, "ticket_id"),
    RM + "GetTicket": Rule(_USER, Check.OWN_TICKET, "ticket_id"),
    RM + "ListTickets": Rule(_USER, Check.OWN_LIST, "user"),
    EC + "CreateEngineConn": Rule(_USER, Check.ACT_AS, "user", apply_like=True),
    EC + "AskEngineConn": Rule(_USER, Check.ACT_AS, "user", apply_like=True),
    EC + "GetEngineConn": Rule(_USER, Check.OWN_ENGINE_CONN, "engine_conn_id"),
    EC + "ListEngineConns": Rule(_USER, Check.OWN_LIST, "user"),
    EC + "KillEngineConn": Rule(_USER, Check.OWN_ENGINE_CONN, "engine_conn_id"),
    DEMAND + "SubmitDemand": Rule(_USER, Check.ACT_AS, "user", apply_like=True, own_labels=True),
    DEMAND + "GetDemand": Rule(_USER, Check.ACT_AS, "user"),
    DEMAND + "ListDemands": Rule(_USER, Check.OWN_LIST, "user"),
    DEMAND + "CancelDemand": Rule(_USER, Check.ACT_AS, "user"),
    DEMAND + "ClaimDemand": Rule(_USER, Check.ACT_AS, "user"),
    # The usage ledger: a user's own usage, like their lists.
    USAGE + "GetUsage": Rule(_USER, Check.OWN_LIST, "user"),
    # The cluster's shape is visible to every user (like YARN's node and queue views):
    # capacity and usage per label and per ECM, no tickets and no EngineConns.
    RM + "GetLabelResource": Rule(_USER),
    RM + "ListLabelResources": Rule(_USER),
    RM + "GetEcm": Rule(_USER),
    RM + "ListEcms": Rule(_USER),
    # Operators only.
    ADMIN + "SetLabelLimit": Rule(_ADMIN_ONLY),
    ADMIN + "ListLabelLimits": Rule(_ADMIN_ONLY),
    ADMIN + "DeleteLabelLimit": Rule(_ADMIN_ONLY),
    ADMIN + "CheckConsistency": Rule(_ADMIN_ONLY),
    ADMIN + "RefreshNodes": Rule(_ADMIN_ONLY),
    ADMIN + "DecommissionEcm": Rule(_ADMIN_ONLY),
    ADMIN + "CordonEcm": Rule(_ADMIN_ONLY),
    ADMIN + "UncordonEcm": Rule(_ADMIN_ONLY),
    ADMIN + "GetClusterInfo": Rule(_ADMIN_ONLY),
    ADMIN + "ListEvents": Rule(_ADMIN_ONLY),
    ADMIN + "PutExternalProvider": Rule(_ADMIN_ONLY),
    ADMIN + "ListExternalProviders": Rule(_ADMIN_ONLY),
    ADMIN + "DeleteExternalProvider": Rule(_ADMIN_ONLY),
    ADMIN + "TestExternalProvider": Rule(_ADMIN_ONLY),
}


class Owners(Protocol):
    """Who owns an object (None when there is no such object)."""

    async def ticket_owner(self, ticket_id: str) -> str | None: ...

    async def engine_conn_owner(self, ec_id: str) -> str | None: ...


def is_public(method: str) -> bool:
    return method.startswith(PUBLIC_PREFIXES)


def rule_for(method: str) -> Rule | None:
    return POLICY.get(method)


def serves_agents(method: str) -> bool:
    """Whether agents or EngineConns call `method` (their requests, heartbeats with
    thousands of EngineConns, may be large); every other method is a user RPC."""
    rule = POLICY.get(method)
    return rule is not None and bool(rule.roles & {Role.AGENT, Role.ENGINECONN})


def acts_for_others(principal: Principal, proxy_users: Collection[str]) -> bool:
    """Admins, and the configured proxy users, may act on any user's behalf."""
    if principal.is_admin:
        return True
    return principal.kind is Kind.USER and principal.name in proxy_users


def _denied(principal: Principal, what: str) -> PermissionDenied:
    return PermissionDenied(f"{principal.describe()} may not {what}")


def _creator_users(request: Any) -> list[str]:
    """The users named by the request's userCreator labels (malformed ones are left to
    the servicer, which refuses them with INVALID_ARGUMENT)."""
    users = []
    for label in getattr(request, "labels", ()):
        if label.key != USER_CREATOR:
            continue
        try:
            users.append(Label(label.key, label.value).user)
        except LabelError:
            continue
    return users


def check_role(method: str, principal: Principal) -> Rule | None:
    """Whether `principal` may call `method` at all, judged on the caller alone (before
    a byte of the request is read): raises Unauthenticated / PermissionDenied, else
    returns the rule (None for public methods)."""
    if is_public(method):
        return None
    rule = rule_for(method)
    if principal.is_admin:
        return rule  # admins may call everything, on anyone's objects
    if rule is None:  # fail closed: an RPC without a rule is nobody's but the admins'
        raise _denied(principal, f"call {method} (no access rule)")
    if not principal.roles & rule.roles:
        if principal.kind is Kind.ANONYMOUS:
            raise Unauthenticated(
                f"{method} needs credentials: a bearer token or a client certificate"
            )
        need = ", ".join(sorted(r.value for r in rule.roles)) or "admin"
        raise _denied(principal, f"call {method} (needs role {need})")
    return rule


async def authorize(
    method: str,
    principal: Principal,
    request: Any,
    owners: Owners,
    proxy_users: Collection[str] = (),
    rules: Sequence[TransformRule] = DEFAULT_RULES,
) -> Rule | None:
    """Allow the call or raise Unauthenticated / PermissionDenied: `check_role`, then
    the rule's ownership check on `request`.

    May fill in the request's ``user`` (ACT_AS, OWN_LIST). Returns the rule (None for
    public methods). For a ``per_message`` rule, `request` is None when the call opens
    (the role is checked) and each message as it arrives (the ownership is)."""
    rule = check_role(method, principal)
    if rule is None or principal.is_admin or rule.check is Check.NONE:
        return rule
    if request is None:  # a call whose client streams: opened on the role alone
        if rule.per_message:
            return rule
        raise _denied(principal, f"call {method} without a request to check")
    value = request
    for name in rule.field.split("."):
        value = getattr(value, name)
    if rule.check is Check.SELF:
        if not principal.claims(value):
            raise _denied(principal, f"act as {rule.field} {value!r}")
        return rule
    others = acts_for_others(principal, proxy_users)
    if rule.check in (Check.ACT_AS, Check.OWN_LIST):
        if value and value != principal.name and not others:
            raise _denied(principal, f"act as another user (field {rule.field})")
        if not value and not others:
            setattr(request, rule.field, principal.name)
        if rule.check is Check.ACT_AS and not others:
            for user in _creator_users(request):
                if user != principal.name:
                    raise _denied(principal, "use the userCreator label of another user")
        if rule.own_labels:
            # A proxy user that names no user acts for the user of the labels.
            creators = _creator_users(request) if others and not value else []
            acting = value or (creators[0] if creators else principal.name)
            _require_own_labels(principal, request, acting, rules)
        return rule
    if others or not value:
        return rule
    lookup = {
        Check.OWN_TICKET: (owners.ticket_owner, "ticket"),
        Check.OWN_ENGINE_CONN: (owners.engine_conn_owner, "EngineConn"),
    }[rule.check]
    owner = await lookup[0](value)
    if owner is not None and owner != principal.name:
        # The answer an unknown id gets: a refusal tells nothing about other tenants,
        # not even that the id exists. The log (the operator's) says what happened.
        who, what = principal.describe(), lookup[1]
        log.info("refused: %s may not act on %s %s (another user's)", who, what, clip(value))
        raise not_found(lookup[1], value)
    return rule


def _require_own_labels(
    principal: Principal, request: Any, user: str, rules: Sequence[TransformRule]
) -> None:
    """The request must charge `user`'s own label, and name no other user's (a proxy
    user acts for one user per request). Malformed labels, none or too many, are left
    to the servicer (INVALID_ARGUMENT there, before any is charged)."""
    if not request.labels or len(request.labels) > MAX_LABELS:
        return
    try:
        labels = [Label(lb.key, lb.value) for lb in request.labels]
        if any(u != user for u in _creator_users(request)):
            raise _denied(principal, "mix the userCreator labels of several users")
        if charges_user(labels, user, rules):
            return
    except LabelError:
        return
    keys = " or ".join(user_rule_keys(rules)) or "userCreator"
    raise PermissionDenied(
        f"{principal.describe()} may not apply on labels that charge no user: add"
        f" userCreator={user}-<creator> with its combination ({keys}) so that the"
        " user's limits apply",
        reason="OWN_LABELS_REQUIRED",
    )
