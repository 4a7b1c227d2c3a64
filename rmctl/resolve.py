"""Objects named by their id or a unique prefix of it: `rmctl engineconn status 3f2a`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from labelrm_client import NotFound, RMClient

__all__ = ["resolve_by_prefix", "resolve_ecm", "resolve_engine_conn", "resolve_ticket"]


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


def resolve_ecm(client: RMClient, given: str) -> Any:
    """The ECM named `given`, or the one whose instance starts with it."""
    return resolve_by_prefix(
        "ECM", given, client.get_ecm, client.list_ecms, lambda e: str(e.instance)
    )


def resolve_engine_conn(client: RMClient, given: str) -> Any:
    """The EngineConn with id `given`, or the one whose id starts with it, as GetEngineConn
    returns it (with its ECM choices, and its secret for its owner)."""
    ec = resolve_by_prefix(
        "EngineConn id",
        given,
        client.get_engine_conn,
        client.list_engine_conns,
        lambda e: str(e.engine_conn_id),
    )
    # Found by prefix in a list, which carries neither executor secrets nor ECM choices.
    return ec if ec.engine_conn_id == given else client.get_engine_conn(ec.engine_conn_id)


def resolve_ticket(client: RMClient, given: str) -> Any:
    """The ticket with id `given`, or the one live ticket whose id starts with it."""
    return resolve_by_prefix(
        "ticket id", given, client.get_ticket, client.list_tickets, lambda t: str(t.ticket_id)
    )
