"""`ecm-agent` console script."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from ecm_agent.agent import RegistrationRefused, build_agent
from ecm_agent.settings import load_agent_settings


async def _run(argv: list[str] | None) -> None:
    agent = build_agent(load_agent_settings(argv))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Stopping the agent never stops its EngineConns: a restarted agent re-attaches.
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


def main(argv: list[str] | None = None) -> int:
    settings = load_agent_settings(argv)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(_run(argv))
    except RegistrationRefused as exc:
        logging.getLogger("ecm_agent").error("registration refused: %s", exc)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
