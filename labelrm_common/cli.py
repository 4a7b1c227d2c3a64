"""The ``main`` of the small command-line tools in labelrm_common (``python -m
labelrm_common.pki``, ``python -m labelrm_common.tokens``; rmctl mounts the same
sub-commands as ``rmctl pki`` and ``rmctl token``).

Kept apart from those modules so that each imports only what its own tool needs (the token
tool must not pull in the cryptography package)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["error_text", "tool_main"]


def error_text(exc: OSError | ValueError) -> str:
    """An error of a file tool for people: ``PATH: what`` for a system error (not Python's
    ``[Errno 2] ...``), the message for anything the tool said itself."""
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def tool_main(
    prog: str,
    add_parser: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None],
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse `argv` with the sub-commands `add_parser` registers and `run` them; an
    OSError or ValueError is one ``error: ...`` line on stderr and exit code 1."""
    parser = argparse.ArgumentParser(prog=prog)
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (OSError, ValueError) as exc:
        print(f"error: {error_text(exc)}", file=sys.stderr)
        return 1
