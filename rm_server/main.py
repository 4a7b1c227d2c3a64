"""`rm-server` console script."""

from __future__ import annotations

import asyncio
import contextlib

from rm_server.config import load_config
from rm_server.dev import run_dev
from rm_server.observability.logging import setup_logging
from rm_server.server import RMServer


def main(argv: list[str] | None = None) -> int:
    config = load_config(argv)
    if config.print_config:
        print(config.describe())
        return 0
    settings = config.settings
    setup_logging(settings.log_level, settings.log_format)
    with contextlib.suppress(KeyboardInterrupt):
        if config.dev:
            asyncio.run(run_dev(settings))
        else:
            asyncio.run(RMServer(settings).run_until_signalled())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
