"""rmctl's contexts: named sets of the RM's address, its CA, a client certificate and a
token, in one file, so that an operator stops exporting three variables per shell
(kubectl's kubeconfig contexts).

The file is ``$LABELRM_CONFIG``, else ``$XDG_CONFIG_HOME/labelrm/rmctl.toml`` (by default
``~/.config/labelrm/rmctl.toml``), written 0600::

    current-context = "prod"

    [contexts.prod]
    rm = "rm1.example.com:7100"
    tls-ca = "/etc/labelrm/ca.crt"
    token-file = "/home/alice/.config/labelrm/prod.token"

    [contexts.dev]
    rm = "127.0.0.1:7100"

One context is in effect: the one ``--context NAME`` names, else ``$LABELRM_CONTEXT``,
else the file's current context. Each setting of the connection comes from the first of:
its command-line flag; the ``--context`` one; its environment variable (``LABELRM_RM``,
``LABELRM_TOKEN``, ``LABELRM_TLS_CA``, ``LABELRM_TLS_CERT``, ``LABELRM_TLS_KEY``); the
``$LABELRM_CONTEXT`` or current one; the default (``127.0.0.1:7100``, plaintext, no
token). `rmctl config set-context|use-context|
get-contexts|current-context|delete-context` edit and show the file; they need no RM.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labelrm_common.files import replace_file
from rmctl.args import rm_target
from rmctl.format import print_table
from rmctl.paths import config_path

__all__ = ["CONTEXT_KEYS", "Config", "config_path", "register"]

# What a context holds: its key in the file -> the rmctl flag it stands for.
CONTEXT_KEYS = {
    "rm": "--rm",
    "tls-ca": "--tls-ca",
    "tls-cert": "--tls-cert",
    "tls-key": "--tls-key",
    "token-file": "--token-file",
    "token": "--token",
}


@dataclass
class Config:
    """The contexts file, as read (empty when there is none)."""

    path: Path
    current: str = ""
    contexts: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None = None) -> Config:
        """The file at `path` (config_path() by default); ValueError naming the file and
        the problem when it is not a contexts file."""
        path = path or config_path()
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"rmctl config {path}: {exc}") from None
        contexts = raw.get("contexts", {})
        if not isinstance(contexts, dict) or not all(
            isinstance(c, dict) for c in contexts.values()
        ):
            raise ValueError(f"rmctl config {path}: [contexts.NAME] must be tables")
        for name, ctx in contexts.items():
            unknown = sorted(set(ctx) - set(CONTEXT_KEYS))
            if unknown:
                raise ValueError(
                    f"rmctl config {path}: context {name!r} has unknown keys {unknown}: "
                    f"expected {', '.join(CONTEXT_KEYS)}"
                )
            if not all(isinstance(v, str) for v in ctx.values()):
                raise ValueError(f"rmctl config {path}: context {name!r}: values are strings")
        current = raw.get("current-context", "")
        if not isinstance(current, str):
            raise ValueError(f"rmctl config {path}: current-context must be a string")
        return cls(path, current, {str(k): dict(v) for k, v in contexts.items()})

    def context(self, name: str, origin: str) -> dict[str, str]:
        """The context `name` (chosen by `origin`, for the message); ValueError naming the
        known ones (and the closest) when there is none of that name."""
        if name in self.contexts:
            return self.contexts[name]
        known = ", ".join(sorted(self.contexts)) or "none yet (rmctl config set-context)"
        close = difflib.get_close_matches(name, list(self.contexts), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"no context {name!r} (from {origin}) in {self.path}: known: {known}{hint}"
        )

    def save(self) -> None:
        """Write the file (0600 when new; an existing file keeps its owner and mode)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lines = ["# rmctl contexts: `rmctl config --help`."]
        if self.current:
            lines.append(f"current-context = {json.dumps(self.current)}")
        for name in sorted(self.contexts):
            lines += ["", f"[contexts.{json.dumps(name)}]"]
            # A JSON string is a valid TOML basic string.
            lines += [f"{k} = {json.dumps(v)}" for k, v in self.contexts[name].items()]
        replace_file(self.path, ("\n".join(lines) + "\n").encode())


# --- `rmctl config ...` ----------------------------------------------------------------------


def register(commands: Any) -> None:
    """`rmctl config ...`: local commands on the contexts file (no RM)."""
    cfg = commands.add_parser(
        "config",
        help="contexts: named RM addresses, CAs and tokens (local file, no RM)",
        description=f"Edit and show rmctl's contexts, in {config_path()} "
        "($LABELRM_CONFIG). A setting comes from its flag, then the context --context "
        "names, then its LABELRM_* variable, then the $LABELRM_CONTEXT or current context.",
    )
    sub = cfg.add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")
    c = sub.add_parser("get-contexts", help="list the contexts; * marks the current one")
    c.set_defaults(local_func=_get_contexts)
    c = sub.add_parser("current-context", help="print the current context's name")
    c.set_defaults(local_func=_current_context)
    c = sub.add_parser("use-context", help="make a context the current one")
    c.add_argument("context", metavar="NAME")
    c.set_defaults(local_func=_use_context)
    c = sub.add_parser(
        "set-context",
        help="create a context, or change the settings given of one",
        description="Settings not given keep their value; an empty value removes one "
        "(--token-file ''). Paths are stored absolute.",
    )
    c.add_argument("context", metavar="NAME")
    c.add_argument("--rm", dest="ctx_rm", metavar="HOST[:PORT]")
    c.add_argument("--tls-ca", dest="ctx_tls_ca", metavar="FILE")
    c.add_argument("--tls-cert", dest="ctx_tls_cert", metavar="FILE")
    c.add_argument("--tls-key", dest="ctx_tls_key", metavar="FILE")
    c.add_argument("--token-file", dest="ctx_token_file", metavar="FILE",
                   help="a file holding the bearer token (keep it 0600)")  # fmt: skip
    c.add_argument("--current", action="store_true", help="and make it the current context")
    c.set_defaults(local_func=_set_context)
    c = sub.add_parser("delete-context", help="remove a context")
    c.add_argument("context", metavar="NAME")
    c.set_defaults(local_func=_delete_context)


def _get_contexts(args: argparse.Namespace) -> int:
    config = Config.load()
    print_table(
        sys.stdout,
        ("current", "name", "rm", "tls-ca", "auth"),
        (
            (
                "*" if name == config.current else "",
                name,
                ctx.get("rm", "-"),
                ctx.get("tls-ca", "-"),
                _auth(ctx),
            )
            for name, ctx in sorted(config.contexts.items())
        ),
    )
    return 0


def _auth(ctx: Mapping[str, str]) -> str:
    if ctx.get("token-file"):
        return f"token-file {ctx['token-file']}"
    if ctx.get("token"):
        return "token"
    if ctx.get("tls-cert"):
        return f"certificate {ctx['tls-cert']}"
    return "-"


def _current_context(args: argparse.Namespace) -> int:
    config = Config.load()
    if not config.current:
        raise ValueError(f"no current context in {config.path} (rmctl config use-context NAME)")
    print(config.current, file=sys.stdout)
    return 0


def _use_context(args: argparse.Namespace) -> int:
    config = Config.load()
    config.context(args.context, "use-context")
    config.current = args.context
    config.save()
    print(f"switched to context {args.context!r} ({config.path})", file=sys.stdout)
    return 0


def _set_context(args: argparse.Namespace) -> int:
    config = Config.load()
    ctx = config.contexts.setdefault(args.context, {})
    for key in CONTEXT_KEYS:
        value = getattr(args, "ctx_" + key.replace("-", "_"), None)
        if value is None:
            continue
        if not value:
            ctx.pop(key, None)
        elif key == "rm":
            ctx[key] = rm_target(value)
        else:
            ctx[key] = str(Path(value).expanduser().resolve())
    if args.current or not config.current:
        config.current = args.context
    config.save()
    current = " (current)" if config.current == args.context else ""
    print(f"context {args.context!r}{current} set in {config.path}", file=sys.stdout)
    return 0


def _delete_context(args: argparse.Namespace) -> int:
    config = Config.load()
    config.context(args.context, "delete-context")
    del config.contexts[args.context]
    if config.current == args.context:
        config.current = ""
    config.save()
    print(f"deleted context {args.context!r} from {config.path}", file=sys.stdout)
    return 0
