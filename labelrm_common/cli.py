"""The ``main`` of the small command-line tools in labelrm_common (``python -m
labelrm_common.pki``, ``python -m labelrm_common.tokens``; rmctl mounts the same
sub-commands as ``rmctl pki`` and ``rmctl token``).

Kept apart from those modules so that each imports only what its own tool needs (the token
tool must not pull in the cryptography package)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

__all__ = ["tool_main"]


def tool_main(
    prog: str,
    add_parser: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None],
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse `argv` with the sub-commands `add_parser` registers and `run` them; an
    OSError or ValueError is one ``error: ...`` line and exit code 1."""
    parser = argparse.ArgumentParser(prog=prog)
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return 1
