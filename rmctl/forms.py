"""kubectl's forms, where they map cleanly onto rmctl's own commands:

    rmctl get nodes                 ->  rmctl node list
    rmctl get engineconns --state idle -o wide
                                    ->  rmctl engineconn list --state idle -o wide
    rmctl get ec 3f2a               ->  rmctl engineconn status 3f2a
    rmctl delete engineconn 3f2a    ->  rmctl engineconn kill 3f2a
    rmctl delete ticket t-1         ->  rmctl ticket release t-1

A kind is taken singular, plural or short (`node`, `nodes`, `no`; `engineconn`, `ec`).
The words are rewritten before parsing, so every option of the command they name works.
Each noun's own removal verb (kill, release, cancel, rm) also answers to `delete`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, TextIO

from labelrm_client import RMClient
from rmctl.words import command_index

__all__ = ["KINDS", "register", "rewrite"]

# kind as typed -> rmctl's noun
KINDS = {
    **dict.fromkeys(("node", "nodes", "no", "ecm", "ecms"), "node"),
    **dict.fromkeys(("engineconn", "engineconns", "ec", "ecs"), "engineconn"),
    **dict.fromkeys(("ticket", "tickets"), "ticket"),
    **dict.fromkeys(("demand", "demands"), "demand"),
    **dict.fromkeys(("limit", "limits"), "limit"),
    **dict.fromkeys(("resource", "resources"), "resource"),
    **dict.fromkeys(("provider", "providers"), "provider"),
}
# noun -> the verb that shows one (None: its list shows everything), and the one removing it
_SHOW = {"node": "status", "engineconn": "status", "ticket": "show", "demand": "show",
         "resource": "show", "limit": None, "provider": None}  # fmt: skip
_DELETE = {"node": "rm", "engineconn": "kill", "ticket": "release", "demand": "cancel",
           "limit": "rm", "provider": "rm", "resource": None}  # fmt: skip


def rewrite(words: Sequence[str]) -> list[str]:
    """`words` with a kubectl form (``get KIND [NAME]``, ``delete KIND NAME``) turned into
    the rmctl command it stands for; anything else unchanged (the parser judges it)."""
    words = list(words)
    at = command_index(words)
    if at is None or words[at] not in ("get", "delete") or len(words) < at + 2:
        return words
    noun = KINDS.get(words[at + 1].lower())
    if noun is None:
        return words
    rest = words[at + 2 :]
    named = bool(rest) and not rest[0].startswith("-")
    verb = (_SHOW[noun] if named else "list") if words[at] == "get" else _DELETE[noun]
    if verb is None:
        return words  # the stand-in parser says why
    return [*words[:at], noun, verb, *rest]


def register(cmds: Any) -> None:
    """`get` and `delete` for help and completion; `rewrite` runs them as rmctl's own
    commands, so these parsers see only what does not map."""
    for verb, text in (("get", "list objects, or show one (kubectl's get)"),
                       ("delete", "remove an object (kubectl's delete)")):  # fmt: skip
        c = cmds.add_parser(verb, help=text, description=__doc__.split("\n\n")[0])
        c.add_argument("kind", choices=sorted(KINDS), metavar="KIND")
        c.add_argument("names", nargs="*", metavar="NAME")
        c.set_defaults(func=_unmapped)


def _unmapped(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    noun = KINDS[args.kind]
    if args.command == "get":
        raise ValueError(f"`rmctl get {args.kind}` takes no NAME: `rmctl {noun} list` shows all")
    raise ValueError(f"{noun}s are not deleted: see `rmctl {noun} --help`")
