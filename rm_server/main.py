"""`rm-server` console script."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from rm_server.config import load_settings
from rm_server.server import RMServer


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(argv)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
        stream=sys.stderr,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(RMServer(settings).run_until_signalled())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
