"""Bearer tokens: a file mapping the SHA-256 of each token to its user and roles.

Tokens themselves are never stored: `rmctl token add` prints a new token once and
writes only its hash. The file is TOML (or JSON when its name ends in ``.json``)::

    [tokens."sha256:6b3a55e0261b0304143f805a24924d0c1c44524821305f31d9277843b8a10f4e"]
    user = "alice"
    roles = ["user"]
    created = "2025-01-01T00:00:00Z"
    note = "alice's laptop"

This module reads and edits the file (`rmctl token`, ``python -m labelrm_common.tokens``)
and needs no RM. How the RM checks tokens on calls, re-reads the file when it changes
and refuses an unsafe file is rm_server/security/tokens.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import secrets
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labelrm_common.cli import tool_main
from labelrm_common.files import replace_file
from labelrm_common.roles import TOKEN_ROLES, Role

TOKEN_PREFIX = "lrm_"
HASH_PREFIX = "sha256:"
_HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")
_USER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")


class TokenFileError(ValueError):
    """The token file cannot be used."""


@dataclass(frozen=True)
class TokenEntry:
    """One token's line in the file: who it authenticates and with which roles."""

    user: str
    roles: frozenset[Role]
    created: str = ""
    note: str = ""


def hash_token(token: str) -> str:
    """``sha256:<hex>`` of a token; what the file stores and lookups compare."""
    return HASH_PREFIX + hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _entry(key: str, raw: Any, where: str) -> TokenEntry:
    if not _HASH_RE.fullmatch(key):
        raise TokenFileError(f"{where}: key {key[:20]!r}… is not sha256:<64 hex digits>")
    if not isinstance(raw, dict):
        raise TokenFileError(f"{where}: entry {key[:15]}… must be a table")
    user, roles = raw.get("user"), raw.get("roles", ["user"])
    if not isinstance(user, str) or not _USER_RE.fullmatch(user):
        raise TokenFileError(f"{where}: entry {key[:15]}… has no valid user")
    if not isinstance(roles, list) or not roles or any(r not in TOKEN_ROLES for r in roles):
        raise TokenFileError(
            f"{where}: entry {key[:15]}… roles must be a non-empty list of "
            + ", ".join(sorted(TOKEN_ROLES))
        )
    return TokenEntry(
        user,
        frozenset(Role(r) for r in roles),
        str(raw.get("created", "")),
        str(raw.get("note", "")),
    )


def parse_tokens(path: Path) -> dict[str, TokenEntry]:
    """hash -> entry from a token file; TokenFileError when it cannot be used."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc}") from exc
    try:
        table = json.loads(data) if path.suffix == ".json" else tomllib.loads(data.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"token file {path} does not parse: {exc}") from exc
    tokens = table.get("tokens", {}) if isinstance(table, dict) else None
    if not isinstance(tokens, dict):
        raise TokenFileError(f"token file {path}: 'tokens' must be a table")
    return {key: _entry(key, raw, str(path)) for key, raw in tokens.items()}


# ----- editing the file ----------------------------------------------------------------------


def _load_for_edit(path: Path) -> dict[str, TokenEntry]:
    return parse_tokens(path) if path.exists() else {}


def _render(path: Path, entries: dict[str, TokenEntry]) -> str:
    def body(e: TokenEntry) -> dict[str, Any]:
        return {"user": e.user, "roles": sorted(e.roles), "created": e.created, "note": e.note}

    if path.suffix == ".json":
        return json.dumps({"tokens": {k: body(e) for k, e in entries.items()}}, indent=2) + "\n"
    lines = [
        "# labelrm tokens: the SHA-256 of each token -> its user and roles.",
        "# Tokens themselves are never stored. Edit with `rmctl token add|revoke|list`.",
    ]
    for key, entry in entries.items():
        lines.append("")
        lines.append(f'[tokens."{key}"]')
        for name, value in body(entry).items():
            # A JSON string or list of strings is valid TOML as it is.
            lines.append(f"{name} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _write(path: Path, entries: dict[str, TokenEntry]) -> None:
    """Replace the file atomically (a reader sees the old or the new table), keeping its
    owner, group and mode (a new file: 0600)."""
    replace_file(path, _render(path, entries).encode())


def add_token(path: Path, user: str, roles: Iterable[str], note: str = "") -> str:
    """Add a new token for `user`; returns the token (shown once, never stored)."""
    entries = _load_for_edit(path)
    token = new_token()
    created = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    raw = {"user": user, "roles": sorted(set(roles)), "created": created, "note": note}
    key = hash_token(token)
    entries[key] = _entry(key, raw, "new token")
    _write(path, entries)
    return token


def revoke(path: Path, *, user: str = "", prefix: str = "") -> int:
    """Remove every token of `user`, or the one token whose hash starts with `prefix`."""
    entries = _load_for_edit(path)
    if user:
        doomed = [k for k, e in entries.items() if e.user == user]
    else:
        wanted = prefix.removeprefix(HASH_PREFIX)
        if len(wanted) < 8:
            raise ValueError("give at least 8 hex digits of the hash")
        doomed = [k for k in entries if k.removeprefix(HASH_PREFIX).startswith(wanted)]
        if len(doomed) > 1:
            raise ValueError(f"hash prefix {wanted} matches {len(doomed)} tokens")
    for key in doomed:
        del entries[key]
    _write(path, entries)
    return len(doomed)


# ----- command line (`rmctl token`) -------------------------------------------------------------


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `token add|list|revoke` (operations on the local token file)."""
    tok = commands.add_parser("token", help="bearer tokens in the RM's token file (local file)")
    sub = tok.add_subparsers(dest="token_command", required=True, metavar="SUBCOMMAND")
    c = sub.add_parser("add", help="add a token and print it (once)")
    c.add_argument("--file", type=Path, required=True, help="the RM's token_file")
    c.add_argument("--user", required=True)
    c.add_argument(
        "--role",
        action="append",
        choices=sorted(TOKEN_ROLES),
        default=None,
        help="repeatable; default: user",
    )
    c.add_argument("--note", default="", help="a reminder of who holds it")
    c = sub.add_parser("list", help="list users, roles and hash prefixes (never tokens)")
    c.add_argument("--file", type=Path, required=True)
    c = sub.add_parser(
        "revoke", aliases=["delete"], help="remove tokens of a user, or one by hash prefix"
    )
    c.add_argument("--file", type=Path, required=True)
    group = c.add_mutually_exclusive_group(required=True)
    group.add_argument("--user", default="")
    group.add_argument("--hash", default="", help="a prefix of the hash `token list` shows")
    tok.set_defaults(local_func=run)


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed `token` command."""
    path: Path = args.file
    if args.token_command == "add":
        token = add_token(path, args.user, args.role or ["user"], args.note)
        print(token)
        print(
            f"# token for {args.user} added to {path}; it is not stored and is shown only now",
            flush=True,
        )
        return 0
    if args.token_command == "list":
        for key, entry in _load_for_edit(path).items():
            roles = ",".join(sorted(entry.roles))
            short = key.removeprefix(HASH_PREFIX)[:12]
            print(f"{short}  {entry.user:<20} {roles:<18} {entry.created}  {entry.note}")
        return 0
    removed = revoke(path, user=args.user, prefix=args.hash)
    print(f"revoked {removed} token(s)")
    return 0 if removed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m labelrm_common.tokens ...` (same as `rmctl token ...`)."""
    return tool_main("labelrm-token", add_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
