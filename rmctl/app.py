"""rmctl's parser and its run: global options, the commands of every noun, output modes,
--watch, and errors as one line on stderr."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from labelrm_client import RMClient, RMError
from labelrm_common.version import VERSION
from rmctl import (
    config,
    demand,
    describe,
    engineconn,
    forms,
    limit,
    local,
    node,
    provider,
    resource,
    status,
    ticket,
    usage,
)
from rmctl.args import Command, Parser
from rmctl.completion import FETCH_TIMEOUT, SCRIPTS, build_tree, save_ids
from rmctl.connection import add_connection_flags, explain, resolve
from rmctl.format import set_table_headers, visible
from rmctl.output import (
    OUTPUTS,
    accept_globals_anywhere,
    chosen_parser,
    derived_output,
    run_watch,
    stream_changes,
)

__all__ = ["GLOBAL_DESTS", "build_parser", "completion_tree", "error_line", "fetch_ids", "run"]

# The top-level options every subcommand accepts too (`rmctl engineconn list -o json`).
GLOBAL_DESTS = (
    "rm", "output", "no_headers", "timeout", "watch_interval", "watch_rounds",
    "token", "tls_ca", "tls_cert", "tls_key", "context",
)  # fmt: skip

# Each registers its commands on the top-level sub-command parsers, in this order.
_NOUNS = (
    resource, ticket, limit, node, engineconn, demand, usage, status, describe, provider, local,
    config,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of rmctl."""
    p = Parser(prog="rmctl", description="labelrm resource manager client", allow_abbrev=False)
    p.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table, wide (more columns), json, yaml, or name (kind/id per object)",
    )
    p.add_argument("--no-headers", action="store_true", help="tables without their header row")
    p.add_argument("--version", action="version", version=f"rmctl {VERSION}")
    p.add_argument("--timeout", type=float, default=10.0, help="per-call deadline in seconds")
    p.add_argument(
        "--watch-interval", type=float, default=2.0, metavar="SECONDS", help="for --watch"
    )
    # Bounds --watch (tests); a person stops it with Ctrl-C.
    p.add_argument("--watch-rounds", type=int, default=None, help=argparse.SUPPRESS)
    add_connection_flags(p)
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = cmds.add_parser(
        "completion",
        help="print the shell completion script: source <(rmctl completion bash|zsh)",
    )
    c.add_argument("shell", choices=sorted(SCRIPTS))
    c.set_defaults(func=None)  # handled before parsing: needs no RM
    c = cmds.add_parser(
        "dev",
        help="start an RM on the embedded database plus one local agent (foreground)",
        description="Runs the installed `rm-server --dev ARGS` (for example --data-dir,"
        " --listen); exit code 127 when rm-server is not installed.",
    )
    c.set_defaults(func=None)  # handled before parsing: argparse cannot pass options through
    for noun in _NOUNS:
        noun.register(cmds)
    forms.register(cmds)
    accept_globals_anywhere(p, GLOBAL_DESTS)
    return p


def error_line(err: RMError) -> str:
    """``error: CODE (REASON): message``, on one line; a refusal names every shortfall.

    The reason is left out when it only repeats the code; the shortfalls are appended
    unless the server's message already lists them.
    """
    head = err.code.name
    if err.reason and err.reason != head:
        head += f" ({err.reason})"
    message = visible(" ".join(err.message.split()))  # one line, whatever the server sent
    missing = [str(s) for s in getattr(err, "shortfalls", ()) if str(s) not in message]
    if missing:
        message += ": " + "; ".join(missing)
    return f"error: {head}: {message}"


def run(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (the process's arguments when None) and run the command chosen."""
    parser = build_parser()
    words = forms.rewrite(sys.argv[1:] if argv is None else argv)  # `get nodes`: `node list`
    try:
        args, extra = parser.parse_known_args(words)
        if extra:  # the subcommand's usage, not rmctl's
            chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    set_table_headers(not args.no_headers)
    code = local.run_local(args)  # `pki`, `token`, `config`: local files, no RM
    if code is not None:
        return code
    try:
        conn = resolve(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    try:
        with RMClient(
            conn.rm, timeout=args.timeout, token=conn.token, tls_ca=conn.tls_ca,
            tls_cert=conn.tls_cert, tls_key=conn.tls_key,
        ) as client:  # fmt: skip
            return _render(client, args, argv)
    except RMError as err:
        hint = explain(err, conn, args.timeout)
        print(f"error: {err.code.name}: {hint}" if hint else error_line(err), file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 1


def _render(client: RMClient, args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """Run the command once, or as --watch says; `-o yaml|name` are views of `-o json`."""
    func: Command = args.func
    mode = args.output
    if mode in ("yaml", "name"):
        args.output = "json"

    def render(out: TextIO) -> int:
        if mode not in ("yaml", "name"):
            return func(client, args, out)
        buf = io.StringIO()
        code = func(client, args, buf)
        derived_output(mode, buf.getvalue(), out)
        return code

    if not getattr(args, "watch", False):
        return render(sys.stdout)
    if mode == "json":
        return stream_changes(
            render, sys.stdout, interval=args.watch_interval, rounds=args.watch_rounds
        )
    return run_watch(render, sys.stdout, interval=args.watch_interval, rounds=args.watch_rounds)


# --- shell completion's side -----------------------------------------------------------------


def completion_tree() -> Any:
    """The command tree shell completion works from (rmctl/completion.py)."""
    nouns = {noun: noun for noun in forms.KINDS.values()}
    return build_tree(build_parser(), {**forms.KINDS, **nouns})


def fetch_ids(kind: str, connection: Sequence[str]) -> int:
    """`rmctl __ids KIND [connection options]`: fetch the ids of a kind from the RM those
    options name and keep them for completion (quietly: it runs behind a TAB)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_connection_flags(parser)
    args, _ = parser.parse_known_args(connection)
    try:
        conn = resolve(args)
        with RMClient(
            conn.rm, timeout=FETCH_TIMEOUT, retries=0, token=conn.token, tls_ca=conn.tls_ca,
            tls_cert=conn.tls_cert, tls_key=conn.tls_key,
        ) as client:  # fmt: skip
            ids = _ID_LISTS[kind](client)
    except (RMError, ValueError, KeyError, OSError):
        return 1
    save_ids(kind, connection, sorted(ids))
    return 0


_ID_LISTS: dict[str, Callable[[RMClient], list[str]]] = {
    "engineconn": lambda c: [
        ec.engine_conn_id
        for state in ("starting", "idle", "busy", "shutting_down")
        for ec in c.list_engine_conns(state=state)
    ],
    "node": lambda c: [e.instance for e in c.list_ecms()],
    "ticket": lambda c: [t.ticket_id for t in c.list_tickets()],
    "demand": lambda c: [d.demand_id for d in c.list_demands()],
    "provider": lambda c: [p.name for p in c.list_external_providers()],
    "limit": lambda c: [lim.pattern for lim in c.list_label_limits()],
}
