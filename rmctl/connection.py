"""How rmctl reaches and authenticates to the RM, and what it says when it cannot.

The settings (``--rm``, ``--token``, ``--tls-ca``, ``--tls-cert``/``--tls-key``) come from
flags, contexts (rmctl/config.py), ``LABELRM_*`` variables and defaults, in the order
rmctl/config.py describes; `resolve` applies it and checks the files it names. A call the
network failed (gRPC's "failed to connect to all addresses; ... Socket closed") is told as
what went wrong and what to try, kubectl's "did you specify the right host or port?".
See docs/security.md and docs/operations.md.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from labelrm_client import RMError
from labelrm_client._impl import DEFAULT_TARGET
from rmctl.args import rm_target
from rmctl.config import Config

__all__ = ["Connection", "add_connection_flags", "explain", "resolve"]

# flag -> (its dest, its environment variable, help)
_FLAGS = {
    "--rm": ("rm", "LABELRM_RM", f"the RM's HOST[:PORT] (default {DEFAULT_TARGET})"),
    "--token": ("token", "LABELRM_TOKEN", "bearer token (prefer a context's token-file or "
                "the environment: flags show in ps)"),
    "--tls-ca": ("tls_ca", "LABELRM_TLS_CA", "PEM CA file that verifies the RM; turns TLS on"),
    "--tls-cert": ("tls_cert", "LABELRM_TLS_CERT", "client certificate (PEM), with --tls-key"),
    "--tls-key": ("tls_key", "LABELRM_TLS_KEY", "client key (PEM)"),
}  # fmt: skip
_FILES = ("tls_ca", "tls_cert", "tls_key")


@dataclass(frozen=True)
class Connection:
    """How to reach the RM, and where each setting came from (for messages)."""

    rm: str
    token: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # dest -> "--rm", "$LABELRM_RM", "context prod", "default"
    origins: Mapping[str, str] = field(default_factory=dict)


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """The global flags that say how to reach and authenticate to the RM."""
    for flag, (dest, env, help_text) in _FLAGS.items():
        metavar = {"rm": "HOST[:PORT]", "token": "VALUE"}.get(dest, "FILE")
        parser.add_argument(flag, dest=dest, default=None, metavar=metavar,
                            help=f"{help_text} [${env}]")  # fmt: skip
    parser.add_argument(
        "--context", default=None, metavar="NAME",
        help="the context to use (rmctl config get-contexts) [$LABELRM_CONTEXT]",
    )  # fmt: skip


def resolve(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Connection:
    """The connection settings: flag, then the --context one, then the environment, then
    the $LABELRM_CONTEXT or current context's, then the default (rmctl/config.py).
    ValueError naming the setting and where it came from for a bad address or a file that
    is not there."""
    env = os.environ if env is None else env
    config = Config.load()
    # One context is in effect: the one --context names (over the environment), else the
    # $LABELRM_CONTEXT or current one (under it); never a mix of two.
    chosen: dict[str, str] = {}
    fallback: dict[str, str] = {}
    name = args.context or env.get("LABELRM_CONTEXT") or config.current
    if args.context:
        chosen = config.context(args.context, "--context")
    elif env.get("LABELRM_CONTEXT"):
        fallback = config.context(name, "$LABELRM_CONTEXT")
    elif name:
        fallback = config.context(name, f"current-context of {config.path}")
    values: dict[str, str] = {}
    origins: dict[str, str] = {}
    for flag, (dest, var, _) in _FLAGS.items():
        found = _first_of(
            flag,
            getattr(args, dest, None),
            (chosen, f"context {name}"),
            (env.get(var), f"${var}"),
            (fallback, f"context {name}"),
        )
        if found is not None:
            values[dest], origins[dest] = found
    rm = values.get("rm", DEFAULT_TARGET)
    origins.setdefault("rm", "default")
    try:
        rm = rm_target(rm)
    except ValueError as exc:
        raise ValueError(f"{exc} (from {origins['rm']})") from None
    for dest in _FILES:
        path = values.get(dest, "")
        if path and not Path(path).is_file():
            what = "no such file" if not Path(path).exists() else "not a file"
            raise ValueError(f"{origins[dest]} {path}: {what}")
    if bool(values.get("tls_cert")) != bool(values.get("tls_key")):
        raise ValueError("a client certificate needs both --tls-cert and --tls-key")
    return Connection(rm=rm, **{d: v for d, v in values.items() if d != "rm"}, origins=origins)


def _first_of(
    flag: str,
    given: str | None,
    chosen: tuple[Mapping[str, str], str],
    env: tuple[str | None, str],
    fallback: tuple[Mapping[str, str], str],
) -> tuple[str, str] | None:
    """(value, origin) of a flag's setting from the first source that has one; a context's
    token file is read only when no source before it gives a token."""
    key = flag.removeprefix("--")
    value: str | None
    if given:
        return given, flag
    if value := _from_context(chosen[0], key):
        return value, chosen[1]
    if env[0]:
        return env[0], env[1]
    if value := _from_context(fallback[0], key):
        return value, fallback[1]
    return None


def _from_context(ctx: Mapping[str, str], key: str) -> str:
    """A context's value for a flag's key; its token may be in a file (token-file)."""
    if key == "token" and ctx.get("token-file") and not ctx.get("token"):
        try:
            return Path(ctx["token-file"]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"token-file {ctx['token-file']}: {exc.strerror}") from None
    return ctx.get(key, "")


# --- transport errors ------------------------------------------------------------------------

_WHERE = "--rm HOST:PORT, $LABELRM_RM or a context (rmctl config get-contexts)"


def explain(err: RMError, conn: Connection, timeout: float) -> str | None:
    """What a call that failed on the way to the RM means, and what to try; None when the
    RM answered (its own error line says enough) or the failure is not recognised."""
    text = err.message
    target = f"{conn.rm} (from {conn.origins.get('rm', 'default')})"
    tls = bool(conn.tls_ca or conn.tls_cert)
    if err.code == grpc.StatusCode.DEADLINE_EXCEEDED and "Deadline Exceeded" in text:
        return (
            f"no answer from the RM at {target} within {timeout:g}s: is the host reachable "
            f"(a firewall dropping packets?) and is that the RM's port? ({_WHERE})"
        )
    if err.code != grpc.StatusCode.UNAVAILABLE:
        return None
    if "Connection refused" in text:
        return (
            f"cannot reach the RM at {target}: connection refused. Is rm-server running "
            f"there, and did you specify the right host or port? ({_WHERE})"
        )
    if "resolving" in text or "lookup" in text:
        return f"cannot resolve the RM's host {target}: is the name right? ({_WHERE})"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            f"the RM at {target} presented a certificate that {conn.tls_ca or 'the system'} "
            f"CA ({conn.origins.get('tls_ca', 'the system trust store')}) does not verify: "
            "is that the CA that issued the RM's certificate, and does the certificate name "
            "this host?"
        )
    if tls and ("WRONG_VERSION_NUMBER" in text or "handshake" in text.lower()):
        return (
            f"the TLS handshake with {target} failed: it does not seem to speak TLS. Drop "
            f"--tls-ca (it came from {conn.origins.get('tls_ca', '?')}) if the RM is "
            "plaintext, or check that this is the RM's port"
        )
    if not tls and ("Socket closed" in text or "Connection reset" in text):
        return (
            f"the RM at {target} closed the connection: it probably requires TLS. Give its "
            "CA with --tls-ca FILE (or $LABELRM_TLS_CA, or a context's tls-ca)"
        )
    return None
