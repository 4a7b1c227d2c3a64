"""Text a caller sent: quoting it in an error message, bounded; and refusing free text
that holds control characters (labelrm_common/text.py says which, and why)."""

from __future__ import annotations

from labelrm_common.text import first_control
from rm_server.domain.errors import DomainError

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


def check_free_text(field: str, value: str, allowed: str = "") -> None:
    """Refuse `value` (a DomainError naming `field`) when it holds a control character
    other than those in `allowed`: stored, it would reach the terminals and pages of
    whoever reads it (an admin's `rmctl describe`, the console)."""
    at = first_control(value, allowed)
    if at is not None:
        raise DomainError(
            f"holds the control character U+{ord(value[at]):04X} at offset {at}"
            f" ({clip(value[max(0, at - 16) : at + 16])}): text may not hold control"
            " characters (terminals and pages would obey them)",
            field,
        )
