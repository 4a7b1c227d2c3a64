"""`rm-server` console script."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from rm_server.config import load_config
from rm_server.dev import run_dev
from rm_server.observability.logging import setup_logging
from rm_server.security.setup import SecurityConfigError
from rm_server.server import RMServer


def main(argv: list[str] | None = None) -> int:
    config = load_config(argv)
    if config.print_config:
        print(config.describe())
        return 0
    settings = config.settings
    setup_logging(settings.log_level, settings.log_format)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            if config.dev:
                asyncio.run(run_dev(settings, tls=config.dev_tls))
            else:
                asyncio.run(RMServer(settings).run_until_signalled())
    except SecurityConfigError as exc:
        print(f"rm-server: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
