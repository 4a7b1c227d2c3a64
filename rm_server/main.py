"""`rm-server` console script."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from labelrm_common.logging import setup_logging
from rm_server.config import load_config
from rm_server.dev import DevUsersError, run_dev
from rm_server.embedded import EmbeddedPostgres
from rm_server.relocated import EmbeddedDatabaseError
from rm_server.security.setup import SecurityConfigError
from rm_server.server import RMServer

log = logging.getLogger(__name__)


def run_on_loop(main: Coroutine[Any, Any, None], event_loop: str) -> None:
    """Run `main` to completion on the configured event loop.

    uvloop by default: every gRPC call takes the loop through about seven iterations
    (accept, read, handler, reply), and at thousands of agents beating the loop's own
    overhead is a tenth of the RM's CPU (docs/benchmarks.md, third round)."""
    factory = None
    if event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed: running on asyncio's own event loop")
        else:
            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def main(argv: list[str] | None = None) -> int:
    """Run rm-server (or print its settings) until it is stopped; returns the exit code.
    A bad setting exits 2 with one line on stderr (load_config)."""
    config = load_config(argv)
    if config.print_config:
        print(config.describe())
        return 0
    settings = config.settings
    setup_logging(settings.log_level, settings.log_format)
    if config.switches["reset"] and settings.database_url:
        print(
            "rm-server: --reset deletes the embedded database, and database_url names an "
            "external one: drop and create that database yourself",
            file=sys.stderr,
        )
        return 2
    try:
        if config.switches["reset"]:
            EmbeddedPostgres(settings.data_dir).reset()
        with contextlib.suppress(KeyboardInterrupt):
            if config.switches["dev"]:
                dev = run_dev(settings, tls=config.switches["dev_tls"])
                run_on_loop(dev, settings.event_loop)
            else:
                run_on_loop(RMServer(settings).run_until_signalled(), settings.event_loop)
    except SecurityConfigError as exc:
        print(f"rm-server: {exc}", file=sys.stderr)
        return 2
    except DevUsersError as exc:
        print(f"rm-server: {exc}", file=sys.stderr)
        return 2
    except EmbeddedDatabaseError as exc:
        print(f"rm-server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
