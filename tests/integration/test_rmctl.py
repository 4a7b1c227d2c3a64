"""rmctl views against a live RM: `-o wide`, the key = value detail views, ticket ids by
unique prefix, `--watch` (bounded here by the hidden --watch-rounds), one-line errors."""

from __future__ import annotations

import io
import json
from typing import Any, TextIO

from labelrm.v1 import demand_pb2, demand_pb2_grpc

from labelrm_client import load_instance
from labelrm_client._impl import parse_labels
from rmctl.output import run_watch
from tests.support.sdk import CLIENT_ECM, ctl, details

GiB = 1024**3
ECM = CLIENT_ECM
ECM_LABEL = f"emInstance={ECM}"
REQUEST = f"{ECM_LABEL},userCreator=alice-IDE,engineType=spark-3.2.1"


async def test_wide_lists_add_columns(client: Any, rm: Any, capsys: Any) -> None:
    await client.apply(REQUEST, load_instance(GiB, 1000, 1), user="alice")
    capsys.readouterr()
    assert await ctl(rm, "-o", "wide", "ticket", "list") == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "TICKET_ID", "STATE", "USER", "CHARGED", "REQUESTED", "USED", "CREATED",
        "LABELS", "LOCK_EXPIRES", "UPDATED",
    ]  # fmt: skip
    assert "userCreator=alice-IDE" in row and "LOCKED" in row

    assert await ctl(rm, "-o", "wide", "resource", "list") == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.split()[-2:] == ["PROTECTED", "UPDATED"]


async def test_show_commands_are_key_value_views(client: Any, rm: Any, capsys: Any) -> None:
    ticket = await client.apply(REQUEST, load_instance(GiB, 1000, 1), user="alice")
    capsys.readouterr()
    assert await ctl(rm, "ticket", "show", ticket.ticket_id) == 0
    view = details(capsys.readouterr().out)
    assert view["ticket_id"] == ticket.ticket_id
    assert view["state"] == "LOCKED" and view["user"] == "alice"
    assert view["charged"] == ECM_LABEL
    assert view["requested"] == "mem=1Gi cpu=1 inst=1"
    assert view["lock_expires"] != "-" and view["end_reason"] == "-"

    assert await ctl(rm, "resource", "show", ECM_LABEL) == 0
    view = details(capsys.readouterr().out)
    assert view["label"] == ECM_LABEL and view["source"] == "ecm"
    assert view["locked"] == "mem=1Gi cpu=1 inst=1" and view["tickets"] == "1"


async def test_ticket_show_accepts_a_unique_prefix(client: Any, rm: Any, capsys: Any) -> None:
    tickets = [await client.apply(REQUEST, load_instance(GiB, 100, 1)) for _ in range(2)]
    a, b = (t.ticket_id for t in tickets)
    common = next(i for i in range(len(a)) if a[i] != b[i])
    capsys.readouterr()

    assert await ctl(rm, "ticket", "show", a[: common + 1]) == 0
    assert details(capsys.readouterr().out)["ticket_id"] == a

    assert await ctl(rm, "ticket", "show", a[:common]) == 1  # both match
    err = capsys.readouterr().err
    assert err.startswith("error: ticket id prefix") and "ambiguous" in err
    assert len(err.splitlines()) == 1

    assert await ctl(rm, "ticket", "show", "t-nothing-like-it") == 1
    assert capsys.readouterr().err.startswith("error: NOT_FOUND: ")


async def test_watch_rerenders_and_stays_quiet_when_piped(
    client: Any, rm: Any, capsys: Any
) -> None:
    capsys.readouterr()
    argv = ("--watch-interval", "0.01", "--watch-rounds", "3", "resource", "list", "--watch")
    assert await ctl(rm, *argv) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # no screen control codes when not a terminal
    assert out.count("LABEL") == 1  # three identical renderings, printed once


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_watch_streams_the_rows_that_change() -> None:
    """`-w` printed the whole table again each round (redrawing a terminal); it prints the
    table once, then a row per object that appeared or changed, and (deleted) for one that
    went away, aligned under the first header, on a terminal or not."""
    header = "ID     STATE   AGE"
    for out in (FakeTty(), io.StringIO()):
        renders = iter([
            f"{header}\na      IDLE    1s\nb      BUSY    1s\n",
            f"{header}\na      IDLE    1s\nb      IDLE    2s\n",  # b changed
            "ID           STATE   AGE\na            IDLE    1s\nlong-one     IDLE    0s\n",
        ])  # fmt: skip

        def render(o: TextIO, renders: Any = renders) -> int:
            o.write(next(renders))
            return 0

        assert run_watch(render, out, interval=0, rounds=3) == 0
        assert out.getvalue() == (
            f"{header}\na      IDLE    1s\nb      BUSY    1s\n"
            "b      IDLE    2s\n"
            "long-one   IDLE    0s\n"
            "b      IDLE    2s   (deleted)\n"
        )


def test_watch_stops_cleanly_on_ctrl_c() -> None:
    def render(out: TextIO) -> int:
        raise KeyboardInterrupt

    assert run_watch(render, io.StringIO(), interval=0) == 0


async def test_demand_list_as_json(client: Any, rm: Any, capsys: Any) -> None:
    stub = demand_pb2_grpc.DemandServiceStub(rm.channel)
    submitted = await stub.SubmitDemand(
        demand_pb2.SubmitDemandRequest(
            demand_id="d-rmctl",
            user="alice",
            labels=parse_labels(REQUEST),
            resource=load_instance(GiB, 1000, 1),
            time_conditions_text="{Start: {Time: [+10m, +10m], Strategy: strict}}",
        )
    )
    assert submitted.created
    capsys.readouterr()
    assert await ctl(rm, "-o", "json", "demand", "list") == 0
    listed = json.loads(capsys.readouterr().out)["demands"]
    assert [(d["demand_id"], d["user"]) for d in listed] == [("d-rmctl", "alice")]
    assert listed[0]["state"] == "DEMAND_STATE_ACCEPTED"
