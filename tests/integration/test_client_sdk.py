"""The Python SDK (labelrm_client) and rmctl against a real in-process RM over a real socket.

The `rm` fixture's server runs on the test's event loop, so blocking calls (RMClient, rmctl)
run in a worker thread via asyncio.to_thread while the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from labelrm.v1 import admin_pb2, resource_manager_pb2

import labelrm_client
from labelrm_client import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    RMClient,
    Shortfall,
    Unavailable,
    load,
    load_instance,
)
from rmctl import main as rmctl_main
from rmctl.app import error_line
from tests.support.sdk import CLIENT_ECM, ctl

GiB = 1024**3
ECM = CLIENT_ECM
ECM_LABEL = f"emInstance={ECM}"
USER = "userCreator=alice-IDE,engineType=spark-3.2.1"
REQUEST = f"{ECM_LABEL},{USER}"


# --- typed errors ----------------------------------------------------------------------------


async def test_oversized_apply_raises_resource_exhausted_with_shortfalls(client: Any) -> None:
    with pytest.raises(ResourceExhausted) as info:
        await client.apply(REQUEST, load_instance(16 * GiB, 1000, 1))
    err = info.value
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.reason == "INSUFFICIENT_RESOURCE"
    assert err.shortfalls == [Shortfall(ECM_LABEL, "memory_bytes", 16 * GiB, 8 * GiB)]
    assert err.metadata["labels"] == ECM_LABEL


async def test_negative_quantity_raises_invalid_argument_with_field(client: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        await client.apply(REQUEST, load(-1, 1000))
    assert info.value.field == "resource.load.memory_bytes"
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_unknown_ticket_and_label_raise_not_found(client: Any) -> None:
    with pytest.raises(NotFound):
        await client.get_ticket("t-does-not-exist")
    with pytest.raises(NotFound):
        await client.get_label_resource({"emInstance": "nowhere:1"})


async def test_double_report_used_raises_failed_precondition_with_state(client: Any) -> None:
    ticket = await client.apply(REQUEST, load_instance(GiB, 1000, 1))
    used = await client.report_used(ticket.ticket_id)
    assert used.state == resource_manager_pb2.TICKET_STATE_USED
    with pytest.raises(FailedPrecondition) as info:
        await client.report_used(ticket.ticket_id)
    assert info.value.state == "USED"


def test_unreachable_server_raises_unavailable_after_retries() -> None:
    with RMClient("127.0.0.1:1", timeout=1.0, retries=1) as c, pytest.raises(Unavailable):
        c.get_ticket("t-1")


# --- request ids and retries -----------------------------------------------------------------


async def test_same_request_id_returns_same_ticket(client: Any) -> None:
    first = await client.apply(REQUEST, load_instance(GiB, 1000, 1), request_id="req-1")
    again = await client.apply(REQUEST, load_instance(GiB, 1000, 1), request_id="req-1")
    other = await client.apply(REQUEST, load_instance(GiB, 1000, 1))
    assert again.ticket_id == first.ticket_id
    assert other.ticket_id != first.ticket_id
    live = [t for t in await client.list_tickets()]
    assert len(live) == 2


class _FakeRpcError(grpc.RpcError):  # type: ignore[misc]  # grpc is untyped here
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__()
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "injected"

    def trailing_metadata(self) -> None:
        return None


def _flaky(real: Any, failures: int, code: grpc.StatusCode, seen: list[str]) -> Any:
    def call(request: Any, timeout: float | None = None) -> Any:
        seen.append(request.request_id)
        if len(seen) <= failures:
            raise _FakeRpcError(code)
        return real(request, timeout=timeout)

    return call


async def test_unavailable_is_retried_with_the_same_generated_request_id(client: Any) -> None:
    seen: list[str] = []
    client._rm.Apply = _flaky(client._rm.Apply, 2, grpc.StatusCode.UNAVAILABLE, seen)
    ticket = await client.apply(REQUEST, load_instance(GiB, 1000, 1))
    assert len(seen) == 3
    assert len(set(seen)) == 1 and seen[0]
    assert [t.ticket_id for t in await client.list_tickets()] == [ticket.ticket_id]


async def test_other_codes_are_not_retried(client: Any) -> None:
    seen: list[str] = []
    client._rm.Apply = _flaky(client._rm.Apply, 1, grpc.StatusCode.ABORTED, seen)
    with pytest.raises(labelrm_client.RMError) as info:
        await client.apply(REQUEST, load_instance(GiB, 1000, 1))
    assert info.value.code == grpc.StatusCode.ABORTED
    assert len(seen) == 1


async def test_sync_client_retries_are_bounded(rm: Any) -> None:
    def run() -> list[str]:
        seen: list[str] = []
        with RMClient(rm.target, retries=2) as c:
            c._rm.Release = _flaky(c._rm.Release, 10, grpc.StatusCode.UNAVAILABLE, seen)
            with pytest.raises(Unavailable):
                c.release("t-1")
        return seen

    seen = await asyncio.to_thread(run)
    assert len(seen) == 3 and len(set(seen)) == 1


# --- pagination and the sync client ----------------------------------------------------------


async def test_list_tickets_walks_every_page(client: Any, rm: Any) -> None:
    ids = {
        (await client.apply(REQUEST, load_instance(GiB // 8, 100, 1))).ticket_id for _ in range(7)
    }
    assert {t.ticket_id for t in await client.list_tickets(page_size=3)} == ids
    locked = [t for t in await client.list_tickets(ECM_LABEL, state="locked", page_size=2)]
    assert {t.ticket_id for t in locked} == ids
    assert [t for t in await client.list_tickets(ECM_LABEL, state="used", page_size=2)] == []

    def sync_ids() -> list[str]:
        with RMClient(rm.target) as c:
            return [t.ticket_id for t in c.list_tickets(page_size=2)]

    listed = await asyncio.to_thread(sync_ids)
    assert len(listed) == 7 and set(listed) == ids


async def test_sync_client_lifecycle(client: Any, rm: Any) -> None:
    def run() -> tuple[Any, Any, Any]:
        with RMClient(rm.target) as c:
            t = c.apply(
                labelrm_client.labels_from(REQUEST), load_instance(GiB, 1000, 1), user="alice"
            )
            used = c.report_used(t.ticket_id, load_instance(GiB // 2, 500, 1))
            done = c.release(t.ticket_id)
            return t, used, done

    t, used, done = await asyncio.to_thread(run)
    assert t.state == resource_manager_pb2.TICKET_STATE_LOCKED and t.user == "alice"
    assert used.state == resource_manager_pb2.TICKET_STATE_USED
    assert done.state == resource_manager_pb2.TICKET_STATE_RELEASED
    assert (await client.check_consistency()).consistent


# --- rmctl -----------------------------------------------------------------------------------


async def test_rmctl_json_matches_sdk(client: Any, rm: Any, capsys: Any) -> None:
    for _ in range(3):
        await client.apply(REQUEST, load_instance(GiB, 1000, 1))
    sdk = [t for t in await client.list_tickets()]
    capsys.readouterr()

    assert await ctl(rm, "-o", "json", "ticket", "list") == 0
    out = capsys.readouterr().out
    parsed = json_format.Parse(out, resource_manager_pb2.ListTicketsResponse())
    assert list(parsed.tickets) == sdk
    assert "ticket_id" in json.loads(out)["tickets"][0]  # proto field names, like grpcurl

    assert await ctl(rm, "-o", "json", "ticket", "show", sdk[0].ticket_id) == 0
    shown = json_format.Parse(capsys.readouterr().out, resource_manager_pb2.Ticket())
    assert shown == await client.get_ticket(sdk[0].ticket_id)

    assert await ctl(rm, "-o", "json", "resource", "show", ECM_LABEL) == 0
    record = json_format.Parse(capsys.readouterr().out, resource_manager_pb2.LabelResource())
    assert record == await client.get_label_resource(ECM_LABEL)


async def test_rmctl_limits_roundtrip(client: Any, rm: Any, capsys: Any) -> None:
    pattern = "userCreator=*-IDE,engineType=spark-3.2.1"
    code = await ctl(
        rm,
        "-o",
        "json",
        "limit",
        "set",
        pattern,
        "--memory",
        "4Gi",
        "--cpu",
        "2",
        "--instances",
        "3",
    )
    assert code == 0
    limit = json_format.Parse(capsys.readouterr().out, admin_pb2.LabelLimit())
    assert limit.max_resource == load_instance(4 * GiB, 2000, 3)
    assert [lim for lim in await client.list_label_limits()] == [limit]

    assert await ctl(rm, "limit", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["PATTERN", "MAX", "UPDATED"]
    assert lines[1].startswith(pattern)

    assert await ctl(rm, "limit", "rm", pattern) == 0
    assert [lim for lim in await client.list_label_limits()] == []


async def test_rmctl_table_header(client: Any, rm: Any, capsys: Any) -> None:
    assert await ctl(rm, "resource", "list", "--source", "ecm") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "LABEL",
        "SOURCE",
        "MAX",
        "USED",
        "LOCKED",
        "RESERVED",
        "LEFT",
        "TICKETS",
    ]
    assert lines[1].split()[:2] == [ECM_LABEL, "ecm"]

    assert await ctl(rm, "ticket", "list", "--state", "used") == 0
    assert capsys.readouterr().out.split()[0] == "TICKET_ID"

    assert await ctl(rm, "check") == 0
    assert capsys.readouterr().out.startswith("consistent")


async def test_rmctl_exit_code_1_on_error(rm: Any, capsys: Any) -> None:
    assert await ctl(rm, "ticket", "show", "t-missing") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: NOT_FOUND: ")
    assert len(captured.err.splitlines()) == 1


async def test_rmctl_error_is_one_line_naming_each_shortfall(client: Any) -> None:
    with pytest.raises(ResourceExhausted) as info:
        await client.apply(REQUEST, load_instance(16 * GiB, 9000, 1))
    (line,) = error_line(info.value).splitlines()
    assert line.startswith("error: RESOURCE_EXHAUSTED (INSUFFICIENT_RESOURCE): ")
    assert len(info.value.shortfalls) == 2
    for shortfall in info.value.shortfalls:  # "emInstance=h1:9101 memory_bytes: requested …"
        assert str(shortfall) in line


def test_rmctl_exit_code_2_on_usage(capsys: Any) -> None:
    assert rmctl_main(["bogus"]) == 2
    assert rmctl_main(["resource", "show", "not-a-label"]) == 2
    assert rmctl_main(["limit", "set", "--cpu", "1"]) == 2  # the pattern is missing
    assert "usage:" in capsys.readouterr().err
