"""`rm-server --dev`: an RM on the embedded database plus one local agent, in the
foreground, ready for grpcurl and rmctl. Ctrl-C stops both (EngineConns end by
their idle timeout)."""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import logging
import os
import pwd
import sys
from pathlib import Path

from labelrm_common.signals import stop_signals
from rm_server.config import Settings
from rm_server.embedded import unreachable_parent
from rm_server.relocated import claim_home, data_dir_key, make_root_dir
from rm_server.security import devtls
from rm_server.server import RMServer, start_unless_signalled, tune_collector, wait_for_signal

log = logging.getLogger(__name__)

SHARED_EC_PYTHON = Path(os.environ.get("LABELRM_EC_VENV", "/opt/labelrm/ec-venv")) / "bin/python"
# Where earlier versions kept the work roots that are now in the data directories' homes.
LEGACY_WORK_ROOT = Path("/var/lib/labelrm/dev-work")


def dev_users() -> str:
    """Who may run EngineConns on the dev agent: $LABELRM_DEV_USERS, else you."""
    configured = os.environ.get("LABELRM_DEV_USERS", "")
    if configured:
        return configured
    if os.geteuid() != 0:
        return getpass.getuser()
    return os.environ.get("SUDO_USER", "")


class DevUsersError(Exception):
    """$LABELRM_DEV_USERS names an account this machine does not have (one line)."""


NO_DEV_USER = (
    "no local agent: running as root with no EngineConn user (root never runs them). "
    "Stop it and run it as yourself, or as root with LABELRM_DEV_USERS=<user> naming "
    'existing accounts (README, "Run an EngineConn")'
)


def checked_dev_users() -> str:
    """`dev_users()`, each of them an existing account (refused at start otherwise)."""
    users = dev_users()
    missing = []
    for user in (u.strip() for u in users.split(",")):
        if not user:
            continue
        try:
            pwd.getpwnam(user)
        except KeyError:
            missing.append(user)
    if missing:
        raise DevUsersError(
            f"LABELRM_DEV_USERS names {', '.join(missing)}: no such user on this machine "
            "(create the account or name an existing one)"
        )
    return users


def ec_python() -> str:
    """An interpreter the EngineConn users can run: our own when they are us, else the
    shared runtime that scripts/install_ec_runtime.sh installs."""
    if os.geteuid() != 0 or not SHARED_EC_PYTHON.exists():
        return sys.executable
    return str(SHARED_EC_PYTHON)


def work_root(data: Path, users: str) -> Path:
    """`<data-dir>/work`, where the EngineConn users can reach it. Run by root for
    users who cannot pass a directory above the data directory (a checkout under
    /root), no such directory is opened up: the work root is `work/` in the data
    directory's home (rm_server/relocated.py), and `<data-dir>/work` a symlink to it."""
    link = data / "work"
    accounts = [pwd.getpwnam(u.strip()) for u in users.split(",") if u.strip()]
    reachable = all(unreachable_parent(data, a) is None for a in accounts)
    if os.geteuid() != 0 or (reachable and not link.is_symlink()):
        link.mkdir(exist_ok=True)
        link.chmod(0o755)
        data.chmod(0o755)  # EngineConn users must reach their work directories
        return link
    work = claim_home(data) / "work"
    legacy = LEGACY_WORK_ROOT / data_dir_key(data)
    if link.is_symlink() and Path(os.readlink(link)) == legacy and not work.exists():
        legacy.rename(work)  # the same file system: the earlier EngineConns' files kept
    make_root_dir(work)
    if link.is_symlink() and Path(os.readlink(link)) != work:
        link.unlink()
    if not link.exists():
        link.symlink_to(work)
    log.info("EngineConn users cannot reach %s: their work root is %s", data, work)
    return work


def agent_command(settings: Settings, port: int, extra: tuple[str, ...] = ()) -> list[str]:
    data = Path(settings.data_dir).resolve()
    work = work_root(data, dev_users())
    return [
        sys.executable,
        "-m",
        "ecm_agent",
        "--rm",
        f"127.0.0.1:{port}",
        "--agent-id",
        "local-agent",
        "--work-root",
        str(work),
        "--state-dir",
        str(data / "agent-state"),
        "--allowed-users",
        dev_users(),
        "--python",
        ec_python(),
        "--heartbeat-interval",
        "1",
        # A development shortcut, not a worker: its EngineConns are not contained (an
        # unprivileged agent could not make cgroups), and the node says so.
        "--isolation",
        "none",
        "--log-format",  # one format on the terminal: the RM's
        settings.log_format,
        *extra,
    ]


def where_the_data_lives(settings: Settings, server: RMServer) -> str:
    """The database's files, and how to start afresh (for the start-up summary)."""
    files = server.database_files
    if files is None:
        return "external database"
    data = Path(settings.data_dir).resolve()
    where = f"embedded database in {files}"
    if files.parent != data:
        where += f", linked from {data / 'pgdata'}"
    return f"{where}; to start afresh stop it and delete {data}"


async def run_dev(settings: Settings, tls: bool = False) -> None:
    users = checked_dev_users()  # before anything starts
    signalled = asyncio.Event()
    with stop_signals(signalled.set):
        await _serve_dev(settings, tls, users, signalled)


async def _serve_dev(settings: Settings, tls: bool, users: str, signalled: asyncio.Event) -> None:
    if not settings.console_listen:  # dev mode serves the web console (any free port)
        settings = dataclasses.replace(settings, console_listen="127.0.0.1:0")
    secured = devtls.prepare(settings) if tls else None
    server = RMServer(secured.settings if secured else settings)
    if not await start_unless_signalled(server, signalled):
        return
    tune_collector()
    agent = None
    if users:
        # With --dev-tls the agent dials the mutual-TLS listener with its certificate.
        port = server.agent_port if secured else server.port
        extra = secured.agent_args if secured else ()
        agent = await asyncio.create_subprocess_exec(*agent_command(settings, port, extra))
        log.info("local agent started (pid %d) for users %s", agent.pid, users)
    target = f"127.0.0.1:{server.port}"
    if secured is None:
        hints = f"  rmctl --rm {target} node list\n  grpcurl -plaintext {target} list"
    else:
        hints = (
            f"  export LABELRM_TOKEN={secured.admin_token}  # an admin token, new at every start\n"
            f"  rmctl --rm {target} --tls-ca {secured.ca} node list\n"
            f'  grpcurl -cacert {secured.ca} -H "authorization: Bearer $LABELRM_TOKEN"'
            f" {target} list"
        )
    agent_line = f"local agent 'local-agent' for {users}." if users else f"{NO_DEV_USER}."
    print(
        f"labelrm dev: RM on {target} ({where_the_data_lives(settings, server)}), "
        f"{agent_line}\n{hints}"
        f"\n  web console: {server.console.url if server.console else 'off'}",
        flush=True,
    )
    try:
        await wait_for_signal(signalled)
    finally:
        if agent is not None and agent.returncode is None:
            agent.terminate()
            await asyncio.wait_for(agent.wait(), 15)
        await server.stop()
