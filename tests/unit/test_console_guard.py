"""The console's Host and Origin checks (rm_server/console/guard.py), without a server."""

from __future__ import annotations

import pytest

from rm_server.console.guard import CONSOLE_HEADER, HostGuard, Refused, host_of


def test_host_of_reads_names_ports_and_ipv6():
    assert host_of("127.0.0.1:7180") == "127.0.0.1"
    assert host_of("[::1]:7180") == "::1"
    assert host_of("RM.Example.COM.") == "rm.example.com"
    assert host_of("localhost") == "localhost"
    assert host_of("") == ""


def test_a_loopback_console_answers_to_its_address_and_localhost_only():
    guard = HostGuard.of("127.0.0.1")
    assert guard.allows("127.0.0.1") and guard.allows("localhost")
    for host in ("rebind.attacker.example", "127.0.0.2", "10.0.0.5", ""):
        assert not guard.allows(host), host
    assert HostGuard.of("::1").allows("::1") and not HostGuard.of("::1").allows("127.0.0.1")


def test_a_wildcard_console_answers_to_addresses_and_its_configured_names():
    guard = HostGuard.of("0.0.0.0", ["rm.example.com"])
    for host in ("10.0.0.5", "::1", "localhost", "rm.example.com"):
        assert guard.allows(host), host
    assert not guard.allows("rebind.attacker.example")  # rebinding needs a name
    named = HostGuard.of("rm1.example.com")
    assert named.allows("rm1.example.com") and not named.allows("localhost")


def headers(**extra: str) -> dict[str, str]:
    return {"Host": "127.0.0.1:7180", **extra}


def test_a_change_needs_the_consoles_origin_and_header():
    guard = HostGuard.of("127.0.0.1")
    guard.check("GET", headers())  # reads need neither
    guard.check("POST", headers(Origin="http://127.0.0.1:7180", **{CONSOLE_HEADER: "1"}))
    for method, sent in (
        ("POST", headers(Origin="http://evil.example", **{CONSOLE_HEADER: "1"})),
        ("POST", headers(Origin="http://127.0.0.1:7181", **{CONSOLE_HEADER: "1"})),
        ("POST", headers(Origin="null", **{CONSOLE_HEADER: "1"})),
        ("DELETE", headers(**{CONSOLE_HEADER: "1"})),
        ("POST", headers(Origin="http://127.0.0.1:7180")),
    ):
        with pytest.raises(Refused) as err:
            guard.check(method, sent)
        assert err.value.status == 403, sent
    with pytest.raises(Refused) as err:
        guard.check("GET", {"Host": "rebind.attacker.example:7180"})
    assert err.value.status == 421
