"""`rmctl pki` (a throwaway CA and certificates), `rmctl token` (the RM's token file) and
`rmctl config` (rmctl's contexts): local files, no RM. The pki and token tools live in
labelrm_common, which the RM uses too."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labelrm_common import pki, tokens
from labelrm_common.cli import error_text

__all__ = ["register", "run_local"]

LocalCommand = Callable[[argparse.Namespace], int]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`pki` and `token`: they work on local files and set `local_func`."""
    pki.add_parser(commands)
    tokens.add_parser(commands)


def run_local(args: argparse.Namespace) -> int | None:
    """Run a local command if one was chosen (its exit code), else None."""
    func: LocalCommand | None = getattr(args, "local_func", None)
    if func is None:
        return None
    try:
        return func(args)
    except (OSError, ValueError) as exc:
        print(f"error: {error_text(exc)}", file=sys.stderr)
        return 1
