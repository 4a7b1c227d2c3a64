"""rmctl's security side: how it authenticates to the RM (``--token``, ``--tls-ca``,
``--tls-cert``/``--tls-key``, each also from ``LABELRM_*``), and the local commands
``rmctl pki`` (a throwaway CA and certificates) and ``rmctl token`` (the RM's token
file), which need no RM. See docs/security.md."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

LocalCommand = Callable[[argparse.Namespace], int]

_FLAGS = (
    ("--token", "LABELRM_TOKEN", "bearer token (prefer the environment: flags show in ps)"),
    ("--tls-ca", "LABELRM_TLS_CA", "PEM CA file that verifies the RM; turns TLS on"),
    ("--tls-cert", "LABELRM_TLS_CERT", "client certificate (PEM), with --tls-key"),
    ("--tls-key", "LABELRM_TLS_KEY", "client key (PEM)"),
)


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """The global flags that say how to reach and authenticate to the RM."""
    for flag, env, help_text in _FLAGS:
        parser.add_argument(
            flag, default=os.environ.get(env, ""), metavar="VALUE" if flag == "--token" else "FILE",
            help=f"{help_text} [${env}]",
        )  # fmt: skip


def client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """RMClient keyword arguments from the parsed global flags."""
    return {
        "token": args.token,
        "tls_ca": args.tls_ca,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
    }


def add_local_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`pki` and `token`: they work on local files and set `local_func`."""
    from labelrm_common import pki, tokens

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
        print(f"error: {exc}")
        return 1
