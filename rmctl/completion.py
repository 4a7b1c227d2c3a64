"""Shell completion for rmctl, bash and zsh, generated from rmctl's own parser.

`rmctl completion bash` (or `zsh`) prints a script whose completion function asks rmctl
itself (`rmctl __complete CWORD WORDS...`) for the candidates: subcommands, options, and
the choices of an option (states, output formats), so it never goes out of date. Install:
``source <(rmctl completion bash)`` in ~/.bashrc (``source <(rmctl completion zsh)`` in
~/.zshrc).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence

__all__ = ["SCRIPTS", "candidates"]

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


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def candidates(parser: argparse.ArgumentParser, words: Sequence[str], cword: int) -> list[str]:
    """What may stand at position `cword` of the command line `words` (words[0] is the
    program), given what precedes it."""
    current = parser
    options = {s: a for a in parser._actions for s in a.option_strings}
    expecting: argparse.Action | None = None
    for word in words[1:cword]:
        if expecting is not None:
            expecting = None
            continue
        if word.startswith("-"):
            action = options.get(word.split("=", 1)[0])
            if action is not None and action.nargs != 0 and "=" not in word:
                expecting = action
            continue
        sub = _subcommands(current).get(word)
        if sub is not None:
            current = sub
            options.update({s: a for a in sub._actions for s in a.option_strings})
    prefix = words[cword] if cword < len(words) else ""
    if expecting is not None:
        choices: Iterable[object] = (
            expecting.choices or getattr(expecting.type, "names", None) or ()
        )
        found = [str(c) for c in choices]
    elif prefix.startswith("-"):
        found = sorted(
            s for s, a in options.items() if a.help != argparse.SUPPRESS or a.dest in ("help",)
        )
    else:
        found = sorted(_subcommands(current))
    return [c for c in found if c.startswith(prefix)]
