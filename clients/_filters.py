"""rmctl's list conventions: label selectors, repeatable case-insensitive states, an AGE
column, --sort-by, and `-A/--all` for ended objects.

A filter value rmctl cannot match (an unknown state, a malformed selector, an ECM prefix
that names none) is an error, never a silently empty list.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

__all__ = [
    "LOST_NODE_AGE_OUT",
    "add_selector",
    "add_sort_by",
    "fmt_age",
    "matches",
    "selected",
    "selector_arg",
    "sort_rows",
    "state_arg",
]


class _Labelled(Protocol):
    @property
    def labels(self) -> Iterable[Any]: ...


L = TypeVar("L", bound=_Labelled)

LOST_NODE_AGE_OUT = 3600.0
"""Seconds after its last heartbeat that a LOST node leaves `rmctl node list` (-A shows it)."""


def selector_arg(text: str) -> list[tuple[str, str]]:
    """ "k=v,k2=v2" -> [(k, v), (k2, v2)]; an argparse error when malformed."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"selector {part!r} is not key=value")
        pairs.append((key.strip(), value.strip()))
    if not pairs:
        raise argparse.ArgumentTypeError("an empty selector: expected key=value[,key=value]")
    return pairs


def add_selector(parser: argparse.ArgumentParser) -> None:
    """`-l/--selector k=v,k2=v2` (repeatable: every pair must match, in any order)."""
    parser.add_argument(
        "-l",
        "--selector",
        action="extend",
        type=selector_arg,
        default=[],
        metavar="K=V[,K=V...]",
        help="only objects with all these labels (any order; repeatable)",
    )


def matches(labels: Iterable[Any], selector: Sequence[tuple[str, str]]) -> bool:
    """Whether label messages (key, value) carry every pair of `selector`."""
    have = {(lb.key, lb.value) for lb in labels}
    return all(pair in have for pair in selector)


def selected(items: Iterable[L], selector: Sequence[tuple[str, str]]) -> list[L]:
    """The items (messages with a ``labels`` field) whose labels carry every pair of
    `selector`, in their order."""
    return [item for item in items if matches(item.labels, selector)]


def state_arg(names: Iterable[str]) -> Callable[[str], str]:
    """An argparse type: a state name in any case ("IDLE", "idle", "Idle"), else an error
    listing the known ones."""
    known = sorted(names)

    def parse(text: str) -> str:
        name = text.strip().lower()
        for prefix in ("engine_conn_state_", "ecm_state_"):
            name = name.removeprefix(prefix)
        if name not in known:
            raise argparse.ArgumentTypeError(
                f"unknown state {text!r}: expected one of {', '.join(known)}"
            )
        return name

    parse.names = known  # type: ignore[attr-defined]  # for shell completion
    return parse


def fmt_age(ts: Any, now: datetime | None = None) -> str:
    """kubectl's AGE: 45s, 12m, 5h, 3d ("-" when unset)."""
    if not ts.seconds and not ts.nanos:
        return "-"
    now = now or datetime.now(UTC)
    seconds = max(0, int((now - ts.ToDatetime(tzinfo=UTC)).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def add_sort_by(parser: argparse.ArgumentParser, columns: Sequence[str]) -> None:
    """`--sort-by COLUMN` (a column name of the table, any case)."""
    parser.add_argument(
        "--sort-by",
        type=str.lower,
        choices=[c.lower() for c in columns],
        default=None,
        metavar="COLUMN",
        help=f"sort by a column: {', '.join(c.lower() for c in columns)}",
    )


def sort_rows(
    items: list[Any], column: str | None, keys: Mapping[str, Callable[[Any], Any]]
) -> list[Any]:
    """`items` sorted by the key of `column` (stable; unchanged without one)."""
    if column is None:
        return items
    return sorted(items, key=keys[column])
