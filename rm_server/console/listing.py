"""Paging a list (pure, no I/O): a snapshot of at most a capped number of rows, read once
per refresh for everyone who looks (cache.py), is filtered by the text its rows show,
sorted by a known column, and cut into the page a browser shows. The answer says how
many rows matched, how many the snapshot kept and how many the selection holds in all,
so a page never presents a cut list as complete."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rm_server.console.views import Json, Row
from rm_server.errors import InvalidArgument

DEFAULT_PAGE = 50
MAX_PAGE = 200
MAX_QUERY = 200  # characters of filter text

SortKey = Callable[[Json], Any]


@dataclass(frozen=True)
class Snapshot:
    """The rows of a selection as read (at most the cap), the number it holds in all
    (more than len(rows): the list is cut), and its counts by state."""

    rows: tuple[Row, ...]
    selected: int
    by_state: Mapping[str, int] = field(default_factory=dict)
    version: int = 0  # which read this is: a page computed from it is kept under it


@dataclass(frozen=True)
class PageQuery:
    q: str
    sort: str
    desc: bool
    offset: int
    limit: int


def _int(params: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = params.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(name, "must be a whole number") from None
    if not lo <= value <= hi:
        raise InvalidArgument(name, f"must be {lo} to {hi}")
    return value


def page_query(params: Mapping[str, str], sorts: Mapping[str, SortKey], default: str) -> PageQuery:
    """The page asked for: ``q`` (filter text), ``sort`` (a column of `sorts`; a leading
    ``-`` sorts descending), ``offset``, ``limit``; InvalidArgument naming the parameter."""
    q = params.get("q", "")
    if len(q) > MAX_QUERY:
        raise InvalidArgument("q", f"must be at most {MAX_QUERY} characters")
    sort = params.get("sort", "") or default
    desc = sort.startswith("-")
    name = sort.removeprefix("-")
    if name not in sorts:
        raise InvalidArgument("sort", f"must be one of {', '.join(sorted(sorts))}")
    offset = _int(params, "offset", 0, 0, 10_000_000)
    limit = _int(params, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    return PageQuery(q.strip().lower(), name, desc, offset, limit)


def matches(text: str, q: str) -> bool:
    """Every word of `q` appears in `text` (both lower case)."""
    return all(word in text for word in q.split())


def _order(value: Any) -> tuple[bool, bool, Any]:
    # Missing values last; numbers before texts: never a comparison between the two.
    if value is None:
        return (True, False, 0)
    if isinstance(value, bool | int | float):
        return (False, False, value)
    return (False, True, str(value))


def page(snap: Snapshot, query: PageQuery, sorts: Mapping[str, SortKey]) -> Json:
    """The page `query` asks for out of `snap`."""
    rows: Sequence[Row] = snap.rows
    if query.q:
        rows = [r for r in rows if matches(r.text, query.q)]
    key = sorts[query.sort]
    present = [r for r in rows if key(r.json) is not None]
    missing = [r for r in rows if key(r.json) is None]
    present.sort(key=lambda r: _order(key(r.json)), reverse=query.desc)
    ordered = present + missing  # missing values last in either direction
    shown = ordered[query.offset : query.offset + query.limit]
    return {
        "rows": [r.json for r in shown],
        "offset": query.offset,
        "limit": query.limit,
        "matched": len(ordered),
        "kept": len(snap.rows),
        "selected": snap.selected,
        "cut": snap.selected > len(snap.rows),
        "by_state": dict(snap.by_state),
        "sort": ("-" if query.desc else "") + query.sort,
    }
