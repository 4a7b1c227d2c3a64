"""The EngineConn's refusal log (engineconn/auth.py): one line per peer and interval,
with a count, whatever the number of refused calls."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engineconn.auth import OTHER_PEERS, RefusalLog, peer_host


class Timers:
    """A manual schedule: the callbacks due, run when the test says the time passed."""

    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[[], None], Timer]] = []

    def __call__(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer()
        self.due.append((delay, callback, timer))
        return timer

    def pass_interval(self) -> None:
        due, self.due = self.due, []
        for _, callback, timer in due:
            if not timer.cancelled:
                callback()


class Timer:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    out = [r.getMessage() for r in caplog.records if r.name == "engineconn.auth"]
    caplog.clear()
    return out


def test_a_flood_gets_one_line_at_once_and_one_per_interval(caplog):
    caplog.set_level(logging.WARNING, logger="engineconn.auth")
    timers = Timers()
    refusals = RefusalLog(interval=60, schedule=timers)
    for i in range(500):
        refusals.refused(f"ipv4:127.0.0.1:{40000 + i}", "/Executor/Execute", "no authorization")
    first = lines(caplog)
    assert len(first) == 1 and "from ipv4:127.0.0.1: no authorization" in first[0]
    refusals.refused("ipv4:127.0.0.1:1", "/Executor/Cancel", "wrong secret")
    timers.pass_interval()
    assert lines(caplog) == [
        "refused 500 more calls from ipv4:127.0.0.1 (no authorization: 499, wrong secret: 1)"
    ]
    # A flood that goes on: one line per interval; a quiet interval closes it.
    refusals.refused("ipv4:127.0.0.1:2", "/Executor/Execute", "no authorization")
    timers.pass_interval()
    assert lines(caplog) == ["refused 1 more call from ipv4:127.0.0.1 (no authorization: 1)"]
    timers.pass_interval()
    assert lines(caplog) == [] and timers.due == []
    refusals.refused("ipv4:127.0.0.1:3", "/Executor/Execute", "no authorization")
    assert len(lines(caplog)) == 1  # a new interval: at once again


def test_close_writes_the_counts_and_stops_the_timers(caplog):
    caplog.set_level(logging.WARNING, logger="engineconn.auth")
    timers = Timers()
    refusals = RefusalLog(interval=60, schedule=timers)
    for peer in ("ipv4:127.0.0.1:5", "ipv6:[::1]:6", "ipv4:127.0.0.1:7", "ipv6:[::1]:8"):
        refusals.refused(peer, "/Executor/Execute", "no authorization")
    assert len(lines(caplog)) == 2  # one per peer address
    refusals.close()
    assert sorted(lines(caplog)) == [
        "refused 1 more call from ipv4:127.0.0.1 (no authorization: 1)",
        "refused 1 more call from ipv6:[::1] (no authorization: 1)",
    ]
    assert all(timer.cancelled for _, _, timer in timers.due)


@given(st.lists(st.integers(0, 5000), max_size=300))
def test_peers_beyond_the_cap_are_counted_together(ports):
    refusals = RefusalLog(interval=60, schedule=Timers(), max_peers=4)
    for port in ports:
        refusals.refused(f"ipv4:10.0.{port // 250}.{port % 250}:1", "/E", "no authorization")
    assert len(refusals._open) <= 5  # four peers and the rest together
    assert set(refusals._open) <= {*(f"ipv4:10.0.{p // 250}.{p % 250}" for p in ports), OTHER_PEERS}


def test_peer_host_drops_the_port():
    assert peer_host("ipv4:127.0.0.1:51234") == "ipv4:127.0.0.1"
    assert peer_host("ipv6:[::1]:51234") == "ipv6:[::1]"
    assert peer_host("unix:/tmp/s") == "unix:/tmp/s"
    assert peer_host("") == "unknown peer"
