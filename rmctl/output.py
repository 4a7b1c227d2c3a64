"""rmctl's output modes beyond table / wide / json, the --watch loops, and its global flags.

`-o yaml` and `-o name` are derived from a command's `-o json` output (one path: every
command renders JSON once; YAML and names are views of it). `-w -o json` streams one JSON
object per change (``{"type": "ADDED"|"MODIFIED"|"DELETED", "object": {...}}``, one per
line, as `kubectl get -w --output-watch-events -o json`) instead of repeated snapshots.

The global flags (`--rm`, `-o`, `--token`, the TLS flags, ...) are also accepted after the
subcommand: `rmctl engineconn list -o json`.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = [
    "OUTPUTS",
    "accept_globals_anywhere",
    "chosen_parser",
    "derived_output",
    "object_name",
    "run_watch",
    "stream_changes",
    "to_yaml",
]

OUTPUTS = ("table", "wide", "json", "yaml", "name")

# An object's id field -> its kind as rmctl names it (`rmctl <kind> ...`).
_ID_FIELDS = (
    ("engine_conn_id", "engineconn"),
    ("demand_id", "demand"),
    ("ticket_id", "ticket"),
    ("instance", "node"),
    ("pattern", "limit"),
    ("label", "resource"),
)
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./@+-]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def to_yaml(value: Any, indent: int = 0) -> str:
    """YAML block style for JSON data (dicts, lists, strings, numbers, booleans, null)."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                out.append(f"{pad}{_scalar(key)}:\n{to_yaml(item, indent + 2)}")
            else:
                inline = to_yaml(item).strip() if isinstance(item, dict | list) else _scalar(item)
                out.append(f"{pad}{_scalar(key)}: {inline}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            body = to_yaml(item, indent + 2)
            out.append(f"{pad}- {body.lstrip()}")
        return "".join(out)
    return pad + _scalar(value) + "\n"


def _objects(doc: Any) -> list[dict[str, Any]]:
    """The objects of a JSON document: the items of its list field, or itself."""
    if isinstance(doc, dict):
        lists = [v for v in doc.values() if isinstance(v, list)]
        if len(lists) == 1 and all(isinstance(i, dict) for i in lists[0]):
            return list(lists[0])
        return [doc]
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def object_name(obj: dict[str, Any]) -> str | None:
    """``kind/id`` of one object (``engineconn/ec-...``), None when it has no id."""
    for key, kind in _ID_FIELDS:
        if obj.get(key):
            return f"{kind}/{obj[key]}"
    return None


def derived_output(mode: str, json_text: str, out: TextIO) -> None:
    """Print a command's JSON output as YAML or as names; other text passes unchanged."""
    try:
        doc = json.loads(json_text)
    except ValueError:
        out.write(json_text)
        return
    if mode == "yaml":
        out.write(to_yaml(doc))
        return
    for obj in _objects(doc):
        name = object_name(obj)
        if name:
            print(name, file=out)


def stream_changes(
    render: Callable[[TextIO], int], out: TextIO, *, interval: float, rounds: int | None
) -> int:
    """`-w -o json`: one JSON line per object that appeared, changed or went away."""
    seen: dict[str, str] = {}
    done = 0
    code = 0
    try:
        while True:
            buf = io.StringIO()
            code = render(buf)
            current: dict[str, dict[str, Any]] = {}
            for obj in _objects(json.loads(buf.getvalue() or "{}")):
                current[object_name(obj) or json.dumps(obj, sort_keys=True)] = obj
            for key, obj in current.items():
                text = json.dumps(obj, sort_keys=True)
                if seen.get(key) != text:
                    kind = "MODIFIED" if key in seen else "ADDED"
                    print(json.dumps({"type": kind, "object": obj}), file=out)
                    seen[key] = text
            for key in [k for k in seen if k not in current]:
                print(
                    json.dumps({"type": "DELETED", "object": json.loads(seen.pop(key))}), file=out
                )
            out.flush()
            done += 1
            if rounds is not None and done >= rounds:
                return code
            time.sleep(interval)
    except KeyboardInterrupt:
        return code


def run_watch(
    render: Callable[[TextIO], int],
    out: TextIO,
    *,
    interval: float,
    title: str,
    rounds: int | None = None,
) -> int:
    """Re-render every `interval` s until Ctrl-C (or `rounds` renderings).

    On a terminal each rendering replaces the screen under a header; piped, only a
    rendering that differs from the previous one is printed, with no control codes.
    """
    last: str | None = None
    done = 0
    try:
        while True:
            buf = io.StringIO()
            code = render(buf)
            text = buf.getvalue()
            if out.isatty():
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                out.write(f"\x1b[H\x1b[2JEvery {interval:g}s: {title}    {stamp}\n\n{text}")
            elif text != last:
                out.write(text)
            out.flush()
            last = text
            done += 1
            if rounds is not None and done >= rounds:
                return code
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend(action.choices.values())
    return found


def accept_globals_anywhere(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """Let every subcommand take the top-level options `names` (their dests) too.

    A copy on a subcommand has no default of its own (argparse.SUPPRESS), so a value
    given before the subcommand stands unless it is given again after it. An option a
    subcommand already defines (its own ``-q``) keeps its meaning there.
    """
    originals = [a for a in parser._actions if a.dest in names and a.option_strings]
    stack = _subparsers(parser)
    while stack:
        sub = stack.pop()
        nested = _subparsers(sub)
        stack.extend(nested)
        if nested:  # only the leaves: a middle parser would see `--watch` as ambiguous
            continue
        taken = set(sub._option_string_actions)
        for action in originals:
            flags = [f for f in action.option_strings if f not in taken]
            if not flags:
                continue
            kwargs: dict[str, Any] = {
                "dest": action.dest,
                "default": argparse.SUPPRESS,
                "help": argparse.SUPPRESS,
            }
            if action.nargs == 0:  # a switch
                kwargs["action"] = "store_const"
                kwargs["const"] = action.const
            else:
                kwargs.update(type=action.type, choices=action.choices, metavar=action.metavar)
            sub.add_argument(*flags, **kwargs)


def chosen_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub)parser of the subcommand `args` selected: its usage is the one to show."""
    while True:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(args, action.dest, None)
                if name in action.choices:
                    parser = action.choices[name]
                    break
        else:
            return parser
