"""Quoting what a caller sent in an error message, bounded."""

from __future__ import annotations

# How much of an offending value an error message quotes: a refusal must not send a
# megabyte back (clients see a huge status as a metadata-size error of their own).
QUOTE_CHARS = 64


def clip(value: object, limit: int = QUOTE_CHARS) -> str:
    """`value` quoted for an error message, cut to `limit` characters (its length said
    when cut)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def short(value: str, limit: int = QUOTE_CHARS) -> str:
    """`value` unquoted, cut to `limit` characters with "..." (for field paths)."""
    return value if len(value) <= limit else value[:limit] + "..."
