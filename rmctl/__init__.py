"""`rmctl`: a command-line client for the labelrm resource manager.

Output: a table by default (`-o wide` adds columns, `--no-headers` drops the header), a
``key = value`` view for `show` commands, `-o json` for the protobuf JSON mapping, `-o yaml`
for the same as YAML, `-o name` for ``kind/id`` lines. Lists take `--watch` (the table once,
then every `--watch-interval` seconds until Ctrl-C a row per object that appeared, changed
or went away; with `-o json`, one JSON line per such object). Global options may also
follow the subcommand. Ids may be abbreviated to a unique prefix.

Exit codes: 0 ok, 1 error (or an inconsistent `check`), 2 usage, 127 `rmctl dev` without
rm-server installed (otherwise rmctl becomes rm-server and exits as it does). An error is one
line on stderr: the status code, the reason and the message (a refusal's message names the
shortfall per label and dimension).

The package: `app` (the parser and a command's run), `args` (argument types and list
conventions), one module per noun (`resource`, `ticket`, `limit`, `node` with `drain`,
`engineconn` with `execute` and `logs`, `demand`, `usage`, `status`, `describe`, `provider`, `local`
for `pki` / `token`, `config` for contexts), `forms` (kubectl's get / delete), `resolve`
(ids by unique prefix), `format` and `output` (tables, detail views, JSON / YAML / names,
--watch), `connection` (how to reach the RM, and what a failure to reach it means),
`completion` with `words` and `paths` (standard library only, for a cheap TAB), and `dev`.
It builds on the SDK (`labelrm_client`) and never imports the server.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rmctl import completion
from rmctl.dev import exec_rm_server_dev
from rmctl.words import command_index

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run rmctl; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    at = command_index(words)
    if at is not None and words[at] == "dev" and not {"-h", "--help"} & set(words):
        return exec_rm_server_dev(words[at + 1 :])  # rm-server's own process from here on
    if words[:1] == ["__complete"] and len(words) > 2 and words[1].isdigit():
        return completion.complete(words[1:], _tree)  # a TAB: grpc stays unloaded
    if words[:1] == ["completion"] and len(words) == 2 and words[1] in completion.SCRIPTS:
        sys.stdout.write(completion.SCRIPTS[words[1]])
        return 0
    # Imported only now: `rmctl dev` and shell completion run without grpc and protobuf.
    from rmctl import app

    if words[:1] == ["__ids"] and len(words) > 1:
        return app.fetch_ids(words[1], words[2:])
    return app.run(argv)


def _tree() -> object:
    """rmctl's command tree for completion, from its parser (the app is loaded for it)."""
    from rmctl import app

    return app.completion_tree()
