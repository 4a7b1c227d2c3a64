"""`ecm-agent` console script.

Errors a person must fix (settings, files, a host that offers no containment) are one
line on stderr and exit code 2; a refused registration exits 3. SIGTERM and SIGINT stop
the agent at any time, also while it waits for an unreachable RM; its EngineConns keep
running (a restarted agent re-attaches them). Told by the RM to shut down (drained, or
excluded by the node lists), it ends its EngineConns, every process of their cgroups.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from ecm_agent.agent import RegistrationRefused, build_agent
from ecm_agent.cgroups import NoContainment
from ecm_agent.containment import Containment, detect_layout
from ecm_agent.settings import AGENT, AgentSettings, SettingsError, check_files, load_agent_config
from labelrm_common.logging import setup_logging
from labelrm_common.settings import error_exit_code
from labelrm_common.signals import stop_signals


def set_up_containment(settings: AgentSettings) -> Containment | None:
    """The agent's containment (None with `isolation = "none"`), its parent cgroup
    made; SettingsError (one line) when this host offers none the agent can use."""
    if settings.isolation == "none":
        return None
    try:
        layout = detect_layout(settings.cgroup_root, settings.cgroup_parent)
        containment = Containment(layout, settings.pids_max)
        containment.prepare()
    except (NoContainment, ValueError) as exc:
        raise SettingsError(
            f"cannot contain EngineConns: {exc}. Fix the host (docs/operations.md,"
            ' "Isolation"), or run without containment: isolation = "none" (--isolation none)'
        ) from None
    return containment


async def _run(settings: AgentSettings, containment: Containment | None) -> None:
    agent = build_agent(settings, containment)
    with stop_signals(agent.stop):
        await agent.run()


def main(argv: list[str] | None = None) -> int:
    """Run the agent until it is stopped; returns the exit code."""
    try:
        config = load_agent_config(argv)
        if config.print_config:
            print(config.describe())
            return 0
        check_files(config.settings)
        containment = set_up_containment(config.settings)
    except SettingsError as exc:
        return error_exit_code(AGENT.prog, exc)
    # The same structured lines as rm-server's (text: logfmt, or JSON), so that `make run`
    # shows one format and a log collector parses both daemons alike.
    setup_logging(config.settings.log_level, config.settings.log_format, sys.stderr)
    try:
        asyncio.run(_run(config.settings, containment))
    except RegistrationRefused as exc:
        logging.getLogger("ecm_agent").error("registration refused: %s", exc)
        return 3
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
