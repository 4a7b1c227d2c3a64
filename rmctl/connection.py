"""How rmctl reaches and authenticates to the RM: ``--rm``, ``--token``, ``--tls-ca``,
``--tls-cert``/``--tls-key``, each also from ``LABELRM_*``. See docs/security.md."""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["add_connection_flags", "client_kwargs"]

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
