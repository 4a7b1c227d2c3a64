"""What a failed EngineConn start records as its reason."""

from __future__ import annotations

import asyncio

from rm_server.app.engineconns import start_failure_reason
from rm_server.errors import ResourceExhausted


def test_a_labelrm_error_records_its_message() -> None:
    assert start_failure_reason(ResourceExhausted("no room on gpu-1")) == "no room on gpu-1"


def test_a_cancelled_call_records_cancelled() -> None:
    assert start_failure_reason(asyncio.CancelledError()) == "cancelled"


def test_a_bug_is_recorded_as_an_internal_error_not_as_cancelled() -> None:
    reason = start_failure_reason(KeyError("ticket_id"))
    assert reason == "internal error: KeyError"
    assert "cancelled" not in reason
