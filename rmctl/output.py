"""rmctl's output modes beyond table / wide / json, the --watch streams, and its global
flags.

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
import itertools
import json
import re
import time
from collections.abc import Callable
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
    render: Callable[[TextIO], int], out: TextIO, *, interval: float, rounds: int | None = None
) -> int:
    """`-w` on a table: the table once, then, every `interval` s until Ctrl-C (or `rounds`
    renderings), a row for each object that appeared or changed, and its last row marked
    ``(deleted)`` when it went away, as `kubectl get -w` streams. Rows are keyed by their
    first column (the object's id) and aligned under the first header."""
    rows: dict[str, list[str]] = {}
    widths: list[int] = []
    done = 0
    code = 0
    try:
        while True:
            buf = io.StringIO()
            code = render(buf)
            lines = buf.getvalue().splitlines()
            if done == 0:
                out.write(buf.getvalue())
                widths = _widths(lines[0]) if lines else []
            # A row's cells, not its text: another row's width moves every column.
            current = {cells[0]: cells for cells in _rows(lines)}
            if done:
                for key, cells in current.items():
                    if rows.get(key) != cells:
                        print(_aligned(cells, widths), file=out)
                for key in [k for k in rows if k not in current]:
                    print(_aligned(rows[key], widths) + "   (deleted)", file=out)
            rows = current
            out.flush()
            done += 1
            if rounds is not None and done >= rounds:
                return code
            time.sleep(interval)
    except KeyboardInterrupt:
        return code


_CELL_GAP = re.compile(r" {3,}")  # print_table joins cells with three spaces


def _rows(lines: list[str]) -> list[list[str]]:
    """The cells of each row of a table's text (without its header, upper case, if it has
    one)."""
    if lines and lines[0] == lines[0].upper() and any(c.isalpha() for c in lines[0]):
        lines = lines[1:]
    return [_CELL_GAP.split(line.strip()) for line in lines if line.strip()]


def _widths(header: str) -> list[int]:
    """Where each column of `header` starts and how wide it is (its cell plus the gap)."""
    starts = [0, *(m.end() for m in _CELL_GAP.finditer(header))]
    return [b - a for a, b in itertools.pairwise(starts)]


def _aligned(cells: list[str], widths: list[int]) -> str:
    """A row laid out in the columns of the first header (a wider cell pushes on)."""
    out = ""
    for i, cell in enumerate(cells):
        width = widths[i] if i < len(widths) else 0
        out += cell if i == len(cells) - 1 else cell.ljust(max(width, len(cell) + 3))
    return out


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
