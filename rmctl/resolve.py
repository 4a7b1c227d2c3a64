"""Objects named by a unique prefix of their id: `rmctl engineconn status 3f2a`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from clients import NotFound

__all__ = ["resolve_by_prefix"]


def resolve_by_prefix(
    kind: str,
    given: str,
    get: Callable[[str], Any],
    candidates: Callable[[], Iterable[Any]],
    key: Callable[[Any], str],
) -> Any:
    """``get(given)``, or else the one candidate whose key starts with `given`.

    Raises the NotFound of `get` when nothing matches, ValueError when several do.
    """
    try:
        return get(given)
    except NotFound:
        matches = [c for c in candidates() if key(c).startswith(given)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise
        shown = ", ".join(key(m) for m in matches[:3])
        more = f" and {len(matches) - 3} more" if len(matches) > 3 else ""
        raise ValueError(
            f"{kind} prefix {given!r} is ambiguous: {len(matches)} match ({shown}{more})"
        ) from None
