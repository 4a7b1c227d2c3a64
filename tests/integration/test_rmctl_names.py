"""Names and verbs, run as a user types them: a typo gets the closest command, kubectl's
`get` / `delete` forms map onto rmctl's own commands, every enumerated value takes any
case, and every removal answers to `delete`."""

from __future__ import annotations

import json
from typing import Any

from labelrm_client import AsyncRMClient, load_instance
from tests.cli import rmctl_run

SPARK = "userCreator=alice-IDE,engineType=spark-3.2.1"


async def test_a_typo_gets_the_closest_command(rm: Any) -> None:
    for argv, suggestion in (
        (("nods", "list"), "did you mean 'nodes'?"),
        (("node", "lst"), "did you mean 'list'?"),
        (("get", "engineconnz"), "did you mean 'engineconn'?"),
        (("-o", "jsn", "node", "list"), "did you mean 'json'?"),
        (("engineconn", "list", "--state", "idel"), "did you mean 'idle'?"),
    ):
        rc, out, err = await rmctl_run(rm, *argv)
        assert (rc, out) == (2, ""), err
        assert err.rstrip().endswith(suggestion), err


async def test_get_and_delete_map_onto_rmctl_commands(rm: Any) -> None:
    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        await client.register_ecm("node-a", load_instance(8 << 30, 4000, 8))
    assert await rmctl_run(rm, "get", "nodes") == await rmctl_run(rm, "node", "list")
    assert await rmctl_run(rm, "get", "no", "-o", "name") == (0, "node/node-a\n", "")
    rc, out, err = await rmctl_run(rm, "get", "node", "node-a", "-o", "json")
    assert rc == 0 and json.loads(out)["instance"] == "node-a", err
    rc, out, err = await rmctl_run(rm, "nodes", "list", "--no-headers")  # a plural noun
    assert rc == 0 and out.split()[0] == "node-a", err

    rc, _, err = await rmctl_run(rm, "limit", "set", "userCreator=*,engineType=*",
                                 "--memory", "4Gi", "--cpu", "4")  # fmt: skip
    assert rc == 0, err
    rc, out, err = await rmctl_run(
        rm, "ticket", "apply", "--labels", SPARK, "--memory", "1Gi", "--cpu", "1", "-q"
    )
    ticket = out.strip()
    rc, out, err = await rmctl_run(rm, "get", "tickets", "-o", "name")
    assert (rc, out) == (0, f"ticket/{ticket}\n"), err
    rc, out, err = await rmctl_run(rm, "delete", "ticket", ticket)
    assert (rc, out) == (0, f"{ticket} RELEASED: released\n"), err
    rc, out, err = await rmctl_run(rm, "delete", "limit", "userCreator=*,engineType=*")
    assert rc == 0 and out.startswith("deleted limit userCreator=*,engineType=*"), err
    rc, out, err = await rmctl_run(rm, "get", "limits", "x")
    assert (rc, err) == (
        1,
        "error: `rmctl get limits` takes no NAME: `rmctl limit list` shows all\n",
    )


async def test_every_enum_takes_any_case(rm: Any) -> None:
    """`demand list --state ACCEPTED` was refused while `engineconn list` took any case."""
    for argv in (
        ("demand", "list", "--state", "ACCEPTED"),
        ("demand", "list", "--state", "demand_state_accepted"),
        ("engineconn", "list", "--state", "Idle"),
        ("-o", "JSON", "resource", "list", "--source", "ECM"),
        ("top", "--by", "Label"),
    ):
        rc, _, err = await rmctl_run(rm, *argv)
        assert rc == 0, (argv, err)


async def test_every_removal_answers_to_delete(rm: Any) -> None:
    """kill, release, cancel, rm, revoke: each noun's own verb, and `delete` for all."""
    for noun in ("engineconn", "ticket", "demand", "limit", "node", "provider", "token"):
        rc, out, err = await rmctl_run(rm, noun, "delete", "--help")
        assert rc == 0 and out.startswith(f"usage: rmctl {noun} "), (noun, err)
