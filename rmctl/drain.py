"""`rmctl node cordon|uncordon|drain|decommission`: taking a node out of service.

- `cordon`: no new work on the node (CordonEcm); what runs there goes on.
- `drain`: cordon, then wait for the node's EngineConns to end; nothing is moved. At the
  deadline (`--deadline`, one hour by default, as Nomad's drain) the ones still running
  are killed and waited for. The node stays registered and cordoned: do the maintenance,
  then `uncordon`. Like `kubectl drain`, the waiting is rmctl's: interrupted, the node
  stays cordoned and nothing is killed.
- `uncordon`: new work again (UncordonEcm; a decommission in progress is called off).
- `decommission`: no new work, and the node leaves once its EngineConns end
  (DecommissionEcm); its history stays (`rmctl describe node`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from labelrm.v1 import admin_pb2

from labelrm_client import RMClient
from labelrm_client._engineconn import LIVE_EC_STATES, ec_state_name, ecm_state_name
from rmctl.args import parse_duration
from rmctl.format import print_json, to_json, visible
from rmctl.resolve import resolve_ecm

__all__ = ["add_drain_commands", "node_state"]

DEFAULT_DEADLINE = 3600.0
KILL_WAIT = 120.0  # seconds to wait for killed EngineConns to end (agents' kill grace)
_POLL = 1.0  # seconds between looks at the node's EngineConns while draining


def add_drain_commands(sub: Any) -> None:
    """Register ``rmctl node cordon|uncordon|drain|decommission``."""
    c = sub.add_parser("cordon", help="no new work on an ECM; what runs there goes on")
    _name(c)
    c.add_argument("--reason", default="", help="recorded in the node's history")
    c.set_defaults(func=cmd_node_cordon)

    c = sub.add_parser(
        "uncordon", help="let an ECM take new work again (calls off a decommission too)"
    )
    _name(c)
    c.set_defaults(func=cmd_node_uncordon)

    c = sub.add_parser(
        "drain",
        help="cordon an ECM and wait for its EngineConns to end (killed at the deadline)",
        description="Cordon the ECM, then wait until none of its EngineConns runs; nothing "
        "is moved. At the deadline those still running are killed. The ECM stays "
        "registered and cordoned: `rmctl node uncordon` puts it back in service.",
    )
    _name(c)
    when = c.add_mutually_exclusive_group()
    when.add_argument(
        "--deadline", type=parse_duration, default=DEFAULT_DEADLINE, metavar="DURATION",
        help="kill what still runs after this long (default 1h; 30m, 2h, seconds)",
    )  # fmt: skip
    when.add_argument("--no-deadline", action="store_true", help="wait as long as it takes")
    when.add_argument("--detach", action="store_true", help="cordon only, do not wait")
    c.add_argument("--reason", default="", help="recorded in the node's history")
    c.set_defaults(func=cmd_node_drain)

    c = sub.add_parser(
        "decommission",
        help="no new work, and the ECM leaves once its EngineConns end (its agent stops)",
    )
    _name(c)
    c.set_defaults(func=cmd_node_decommission)


def _name(c: argparse.ArgumentParser) -> None:
    c.add_argument("name", metavar="NAME", help="an ECM instance, or a unique prefix of one")


def node_state(e: Any) -> str:
    """The ECM's state, with ``,CORDONED`` when it is (kubectl's Ready,SchedulingDisabled)."""
    state = ecm_state_name(e.state)
    return f"{state},CORDONED" if e.cordoned else state


def cmd_node_cordon(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl node cordon NAME [--reason TEXT]`."""
    e = client.cordon_ecm(resolve_ecm(client, args.name).instance, args.reason)
    if not print_json(out, args.output, e):
        print(f"{e.instance} cordoned: no new work; {e.live_engine_conns} EngineConns "
              "go on running", file=out)  # fmt: skip
    return 0


def cmd_node_uncordon(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl node uncordon NAME`."""
    before = resolve_ecm(client, args.name)
    e = client.uncordon_ecm(before.instance)
    if print_json(out, args.output, e):
        return 0
    called_off = " (its decommission is called off)" if ecm_state_name(before.state) == (
        "DRAINING"
    ) else ""  # fmt: skip
    print(f"{e.instance} {node_state(e)}: takes new work{called_off}", file=out)
    return 0


def _live_on(client: RMClient, instance: str) -> set[str]:
    return {
        ec.engine_conn_id
        for state in LIVE_EC_STATES
        for ec in client.list_engine_conns(ecm=instance, state=state)
    }


def cmd_node_drain(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl node drain NAME [--deadline D | --no-deadline | --detach] [--reason TEXT]`:
    one line per EngineConn as it ends."""
    instance = resolve_ecm(client, args.name).instance
    client.cordon_ecm(instance, args.reason or "drained")
    live = _live_on(client, instance)
    deadline = None if args.no_deadline or args.detach else time.monotonic() + args.deadline
    until = "" if deadline is None else f" (killed after {args.deadline:g}s)"
    print(f"{instance} cordoned: waiting for {len(live)} EngineConns to end{until}", file=out)
    if args.detach:
        return 0
    killed_at: float | None = None
    while live:
        out.flush()
        time.sleep(_POLL)
        now_live = _live_on(client, instance)
        for ec_id in sorted(live - now_live):
            ec = client.get_engine_conn(ec_id)
            reason = visible(" ".join(ec.reason.split())) or "-"
            print(f"engineconn/{ec_id} ended: {ec_state_name(ec.state)} {reason}", file=out)
        live = now_live
        if live and killed_at is None and deadline is not None and time.monotonic() >= deadline:
            print(f"deadline passed: killing {len(live)} EngineConns", file=out)
            for ec_id in sorted(live):
                client.kill_engine_conn(ec_id, f"drain of {instance}: deadline passed")
            killed_at = time.monotonic()
        if live and killed_at is not None and time.monotonic() - killed_at > KILL_WAIT:
            raise ValueError(
                f"{len(live)} EngineConns on {instance} were killed {KILL_WAIT:g}s ago and "
                f"have not ended ({', '.join(sorted(live))}); is its agent alive? "
                f"`rmctl node status {instance}`"
            )
    print(f"{instance} drained: cordoned, no EngineConns; `rmctl node uncordon {instance}` "
          "puts it back in service", file=out)  # fmt: skip
    return 0


def cmd_node_decommission(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl node decommission NAME` (DecommissionEcm)."""
    instance = resolve_ecm(client, args.name).instance
    live = client.decommission_ecm(instance)
    if args.output == "json":
        print(to_json(admin_pb2.DecommissionEcmResponse(live_engine_conns=live)), file=out)
    elif live:
        print(
            f"{instance} DRAINING: {live} live EngineConns; no new ones start there, "
            "and the ECM leaves once they end",
            file=out,
        )
    else:
        print(
            f"{instance} DRAINING: no live EngineConns; it leaves at its next heartbeat", file=out
        )
    return 0
