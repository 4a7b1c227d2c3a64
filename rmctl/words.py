"""The command line as words, before any parser sees it: where the command is, after the
global options (`rmctl --rm h:1 -o json node list`). Standard library only: `rmctl dev`
and shell completion read it without loading the rest of rmctl."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["GLOBAL_WITH_VALUE", "command_index"]

GLOBAL_WITH_VALUE = frozenset(
    {
        "--rm",
        "-o",
        "--output",
        "--timeout",
        "--watch-interval",
        "--watch-rounds",
        "--token",
        "--tls-ca",
        "--tls-cert",
        "--tls-key",
        "--context",
    }
)
"""The global options that take a value (the next word, unless given as --opt=value)."""


def command_index(words: Sequence[str]) -> int | None:
    """Where the command word is, skipping global options and their values."""
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word in GLOBAL_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            return i
    return None
