"""Shell completion for rmctl, bash and zsh: commands, options, their values, and ids.

`rmctl completion bash` (or `zsh`) prints a script whose completion function asks rmctl
itself (`rmctl __complete CWORD WORDS...`) for the candidates, so it never goes out of
date. Install: ``source <(rmctl completion bash)`` in ~/.bashrc (``... zsh`` in ~/.zshrc).

Each TAB starts rmctl, so that start is kept cheap: this module needs the standard
library only. The command tree (subcommands, options, choices, which positional takes
which kind of id) is built from rmctl's parser once and kept in the cache directory
(``$XDG_CACHE_HOME/rmctl``, by default ``~/.cache/rmctl``), keyed by rmctl's own files,
so an upgrade rebuilds it. Ids (EngineConns, nodes, tickets, demands, providers, limits)
come from a list per RM and kind in the same directory: a list older than IDS_FRESH
seconds is answered as it is while a background `rmctl __ids` fetches it again; for a
kind never fetched for that RM the TAB waits for the fetch up to FETCH_TIMEOUT (which then
goes on for the next TAB). Contexts come from the contexts file.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rmctl.paths import cache_dir, config_path
from rmctl.words import GLOBAL_WITH_VALUE

__all__ = ["SCRIPTS", "build_tree", "candidates", "complete", "save_ids"]

_BASH = """# rmctl completion for bash: source <(rmctl completion bash)
_rmctl_complete() {
    local IFS=$'\\n'
    COMPREPLY=($("${COMP_WORDS[0]}" __complete "$COMP_CWORD" "${COMP_WORDS[@]}" 2>/dev/null))
}
complete -o default -F _rmctl_complete rmctl
"""

_ZSH = """# rmctl completion for zsh: source <(rmctl completion zsh)
autoload -U +X bashcompinit && bashcompinit
""" + _BASH.split("\n", 1)[1]

SCRIPTS = {"bash": _BASH, "zsh": _ZSH}

IDS_FRESH = 5.0  # seconds an id list is used without fetching it again
FETCH_TIMEOUT = 2.0  # seconds a TAB waits for an id list never fetched before
_TREE_VERSION = 1

# A positional's dest -> the kind of id it takes ("name": the noun's own kind; "@": the
# kind the positional before it names, as in `describe KIND ID` and `get KIND NAME`).
_ID_DESTS = {
    "ec_id": "engineconn",
    "ticket_id": "ticket",
    "ticket_ids": "ticket",
    "demand_id": "demand",
    "pattern": "limit",
    "context": "context",
    "name": "name",
    "object_id": "@",
    "names": "@",
}
_NAMED = {"node": "node", "provider": "provider"}  # noun -> the kind its NAME is


# --- the command tree ------------------------------------------------------------------------


def _tree_key() -> str:
    """Changes whenever one of the files that make rmctl's parser changes."""
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + [here.parent / "labelrm_common" / n
                                         for n in ("pki.py", "tokens.py")]  # fmt: skip
    digest = hashlib.sha256(str(_TREE_VERSION).encode())
    for path in files:
        with contextlib.suppress(OSError):
            st = path.stat()
            digest.update(f"{path}:{st.st_mtime_ns}:{st.st_size}".encode())
    return digest.hexdigest()[:16]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def build_tree(parser: argparse.ArgumentParser, kinds: dict[str, str], noun: str = "") -> Any:
    """The parts of `parser` completion needs, as JSON data: options (whether each takes a
    value, its choices, whether help shows it), subcommands, and positionals (choices, or
    the kind of id). `kinds` maps every kind word of `get`/`describe` to its noun."""
    node: dict[str, Any] = {"opts": {}, "subs": {}, "pos": []}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                node["subs"][name] = build_tree(sub, kinds, noun or name)
            continue
        choices = action.choices or getattr(action.type, "names", None) or ()
        if action.option_strings:
            entry = {
                "value": action.nargs != 0,
                "choices": [str(c) for c in choices],
                "shown": action.help != argparse.SUPPRESS or action.dest == "help",
            }
            for flag in action.option_strings:
                node["opts"][flag] = entry
            continue
        kind = _ID_DESTS.get(action.dest, "")
        if kind == "name":
            kind = _NAMED.get(kinds.get(noun, noun), "")
        many = action.nargs in ("*", "+", argparse.REMAINDER)
        node["pos"].append({"choices": [str(c) for c in choices], "ids": kind, "many": many})
    if not noun:
        node["kinds"] = kinds
    return node


def load_tree(build: Callable[[], Any]) -> Any:
    """The cached tree, or `build()`'s (then cached) when there is none for these files."""
    path = cache_dir() / f"tree-{_tree_key()}.json"
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    tree = build()
    with contextlib.suppress(OSError):
        _write(path, json.dumps(tree))
    return tree


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


# --- candidates ------------------------------------------------------------------------------

Ids = Callable[[str], list[str]]


def candidates(tree: Any, words: Sequence[str], cword: int, ids: Ids) -> list[str]:
    """What may stand at position `cword` of the command line `words` (words[0] is the
    program), given what precedes it; `ids(kind)` lists the ids of a kind."""
    node = tree
    opts = dict(tree["opts"])
    expecting: dict[str, Any] | None = None
    given: list[str] = []  # the positionals so far, of the innermost command
    for word in words[1:cword]:
        if expecting is not None:
            expecting = None
        elif word.startswith("-"):
            option = opts.get(word.split("=", 1)[0])
            if option is not None and option["value"] and "=" not in word:
                expecting = option
        elif not given and word in node["subs"]:
            node = node["subs"][word]
            opts.update(node["opts"])
        else:
            given.append(word)
    prefix = words[cword] if cword < len(words) else ""
    if expecting is not None:
        found: Iterable[str] = expecting["choices"]
    elif prefix.startswith("-"):
        found = sorted(flag for flag, o in opts.items() if o["shown"])
    elif node["subs"] and not given:
        found = sorted(node["subs"])
    else:
        found = _positional(tree, node, given, ids)
    return [c for c in found if c.startswith(prefix)]


def _positional(tree: Any, node: Any, given: list[str], ids: Ids) -> list[str]:
    slots = node["pos"]
    if not slots:
        return []
    slot = slots[min(len(given), len(slots) - 1)]
    if len(given) >= len(slots) and not slot["many"]:
        return []
    if slot["choices"]:
        return list(slot["choices"])
    kind = slot["ids"]
    if kind == "@":  # the kind the positional before names
        kind = tree["kinds"].get(given[0].lower(), "") if given else ""
    return ids(kind) if kind else []


# --- ids -------------------------------------------------------------------------------------


def _connection_words(words: Sequence[str]) -> list[str]:
    """The global options of a command line that say which RM (and how to reach it)."""
    out: list[str] = []
    for i, word in enumerate(words):
        flag = word.split("=", 1)[0]
        if flag in GLOBAL_WITH_VALUE and flag not in ("-o", "--output", "--watch-interval",
                                                      "--watch-rounds", "--timeout"):  # fmt: skip
            out += [word] if "=" in word else words[i : i + 2]
    return out


def _ids_path(kind: str, connection: Sequence[str]) -> Path:
    # Keyed by how the RM was named: the options, the variables and the contexts file.
    env = [os.environ.get(v, "") for v in ("LABELRM_RM", "LABELRM_CONTEXT", "LABELRM_CONFIG",
                                           "LABELRM_TOKEN", "LABELRM_TLS_CA")]  # fmt: skip
    key = hashlib.sha256(json.dumps([*connection, *env]).encode()).hexdigest()[:16]
    return cache_dir() / "ids" / key / kind


def save_ids(kind: str, connection: Sequence[str], ids: Iterable[str]) -> None:
    """Keep the ids of a kind for the RM `connection` names (rmctl __ids writes them)."""
    _write(_ids_path(kind, connection), "".join(f"{i}\n" for i in ids))


def _ids(kind: str, words: Sequence[str]) -> list[str]:
    import subprocess  # here, not on every TAB: only ids need it

    if kind == "context":
        return _contexts()
    connection = _connection_words(words)
    path = _ids_path(kind, connection)
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        age = None
    if age is None or age > IDS_FRESH:
        command = [sys.executable, "-m", "rmctl", "__ids", kind, *connection]
        with contextlib.suppress(OSError):
            fetch = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            if age is None:  # never fetched for this RM: wait for it, a little
                # Not killed at the timeout: it goes on, and the next TAB has the list.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    fetch.wait(FETCH_TIMEOUT)
    try:
        return path.read_text().split()
    except OSError:
        return []


def _contexts() -> list[str]:
    import tomllib  # here, not on every TAB: it is half the start-up

    with contextlib.suppress(OSError, tomllib.TOMLDecodeError):
        raw = tomllib.loads(config_path().read_text(encoding="utf-8"))
        return sorted(raw.get("contexts", {}))
    return []


def complete(words: Sequence[str], build: Callable[[], Any]) -> int:
    """`rmctl __complete CWORD WORDS...`: print the candidates, one per line."""
    tree = load_tree(build)
    found = candidates(tree, words[1:], int(words[0]), lambda kind: _ids(kind, words[1:]))
    if found:
        print("\n".join(found))
    return 0
