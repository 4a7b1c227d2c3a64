"""Abuse limits with a manual clock."""

from __future__ import annotations

import pytest

from labelrm_common.roles import Role
from rm_server.errors import ResourceExhausted
from rm_server.security.identity import Kind, Principal
from rm_server.security.limits import (
    RATE_LIMITED,
    TOO_MANY_AUTH_FAILURES,
    TOO_MANY_STREAMS,
    TOO_MANY_WAITING,
    Limits,
    LimitSettings,
    RateKeys,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_is_a_token_bucket_per_user():
    clock = Clock()
    limits = Limits(LimitSettings(apply_rate=2, apply_burst=3), clock)
    for _ in range(3):
        limits.admit("alice", waiting=False)
    with pytest.raises(ResourceExhausted) as err:
        limits.admit("alice", waiting=False)
    assert err.value.reason == RATE_LIMITED and "retry in 0.50 s" in err.value.message
    limits.admit("bob", waiting=False)  # another user has a bucket of their own
    clock.now += 0.5
    limits.admit("alice", waiting=False)  # one token back after 1/rate seconds
    with pytest.raises(ResourceExhausted):
        limits.admit("alice", waiting=False)
    clock.now += 100
    for _ in range(3):  # refills up to the burst, not beyond
        limits.admit("alice", waiting=False)
    with pytest.raises(ResourceExhausted):
        limits.admit("alice", waiting=False)


def test_zero_rate_is_unlimited():
    limits = Limits(LimitSettings(apply_rate=0, apply_burst=0), Clock())
    for _ in range(1000):
        limits.admit("alice", waiting=False)


def test_waiting_applies_are_capped_per_user():
    limits = Limits(LimitSettings(apply_rate=0, max_waiting_applies=2), Clock())
    first = limits.admit("alice", waiting=True)
    second = limits.admit("alice", waiting=True)
    with pytest.raises(ResourceExhausted) as err:
        limits.admit("alice", waiting=True)
    assert err.value.reason == TOO_MANY_WAITING
    limits.admit("alice", waiting=False)  # not waiting: not counted
    limits.admit("bob", waiting=True)
    first()
    first()  # idempotent
    assert limits.waiting("alice") == 1
    limits.admit("alice", waiting=True)
    second()
    assert limits.waiting("alice") == 1


def test_refused_waiting_apply_takes_no_rate_token():
    limits = Limits(LimitSettings(apply_rate=1, apply_burst=1, max_waiting_applies=1), Clock())
    limits.admit("alice", waiting=True)
    with pytest.raises(ResourceExhausted) as err:
        limits.admit("alice", waiting=True)
    assert err.value.reason == TOO_MANY_WAITING


def test_failed_authentications_throttle_the_peer_for_the_window():
    clock = Clock()
    limits = Limits(LimitSettings(auth_failure_limit=3, auth_failure_window=60), clock)
    for _ in range(3):
        limits.check_peer("ipv4:10.0.0.9")
        limits.auth_failed("ipv4:10.0.0.9")
    with pytest.raises(ResourceExhausted) as err:
        limits.check_peer("ipv4:10.0.0.9")
    assert err.value.reason == TOO_MANY_AUTH_FAILURES
    limits.check_peer("ipv4:10.0.0.10")  # other peers are not affected
    clock.now += 61
    limits.check_peer("ipv4:10.0.0.9")  # the window passed


def test_every_user_rpc_counts_against_a_per_user_call_rate():
    clock = Clock()
    limits = Limits(LimitSettings(call_rate=1, call_burst=2), clock)
    limits.admit_call("bob")
    limits.admit_call("bob")
    with pytest.raises(ResourceExhausted) as err:
        limits.admit_call("bob")
    assert err.value.reason == RATE_LIMITED and "call_rate" in err.value.message
    limits.admit_call("alice")  # bob's flood is bob's alone
    clock.now += 1
    limits.admit_call("bob")
    Limits(LimitSettings(call_rate=0), clock).admit_call("bob")  # 0: unlimited


def test_public_streams_are_capped_per_peer():
    limits = Limits(LimitSettings(max_watch_streams=2), Clock())
    first = limits.open_stream("ipv4:10.0.0.1")
    limits.open_stream("ipv4:10.0.0.1")
    with pytest.raises(ResourceExhausted) as err:
        limits.open_stream("ipv4:10.0.0.1")
    assert err.value.reason == TOO_MANY_STREAMS
    limits.open_stream("ipv4:10.0.0.2")  # another address has its own places
    first()
    first()  # closing twice frees one place only
    limits.open_stream("ipv4:10.0.0.1")
    with pytest.raises(ResourceExhausted):
        limits.open_stream("ipv4:10.0.0.1")


class CountingOwners:
    """`policy.Owners` from a dict, counting the EngineConn lookups."""

    def __init__(self, owners: dict[str, str]) -> None:
        self.owners = owners
        self.lookups = 0

    async def ticket_owner(self, ticket_id: str) -> str | None:
        return None

    async def engine_conn_owner(self, ec_id: str) -> str | None:
        self.lookups += 1
        return self.owners.get(ec_id)


async def test_engineconns_share_their_owners_rate_apart_from_the_owners_calls():
    limits = Limits(LimitSettings(call_rate=1, call_burst=2), Clock())
    owners = CountingOwners({"ec-1": "alice", "ec-2": "alice", "ec-3": "bob"})
    keys = RateKeys(owners)

    def engineconn(ec_id: str) -> Principal:
        return Principal(Kind.ENGINECONN, ec_id, frozenset({Role.ENGINECONN}))

    await keys.admit(limits, engineconn("ec-1"))
    await keys.admit(limits, engineconn("ec-2"))
    with pytest.raises(ResourceExhausted) as err:  # alice's EngineConns' burst is spent
        await keys.admit(limits, engineconn("ec-1"))
    assert err.value.reason == RATE_LIMITED
    assert "EngineConns of user 'alice'" in err.value.message
    await keys.admit(limits, engineconn("ec-3"))  # bob's have their own
    alice = Principal(Kind.USER, "alice", frozenset({Role.USER}))
    await keys.admit(limits, alice)  # alice's own calls too
    await keys.admit(limits, alice)
    with pytest.raises(ResourceExhausted):
        await keys.admit(limits, alice)
    # An owner is read once per EngineConn; admins and agents are not counted.
    assert owners.lookups == 3
    admin = Principal(Kind.USER, "ops", frozenset({Role.ADMIN}))
    agent = Principal(Kind.AGENT, "agent1", frozenset({Role.AGENT}))
    for _ in range(10):
        await keys.admit(limits, admin)
        await keys.admit(limits, agent)
    # An EngineConn without a row any more counts on its own.
    await keys.admit(limits, engineconn("ec-gone"))
    await keys.admit(limits, engineconn("ec-gone"))
    with pytest.raises(ResourceExhausted) as err:
        await keys.admit(limits, engineconn("ec-gone"))
    assert "EngineConn 'ec-gone' (no owner)" in err.value.message
    await keys.admit(limits, engineconn("ec-3"))  # and not on bob's
