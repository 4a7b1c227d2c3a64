"""ecm-agent settings: defaults < TOML file < LABELRM_AGENT_* environment < flags.

Each setting is declared once below; the shared loader (labelrm_common/settings.py) derives
the flags, `--help`, `--print-config` and the tables of docs/configuration.md.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labelrm.v1 import resource_pb2

from labelrm_common.logging import LOG_FORMATS
from labelrm_common.settings import Loaded, Program, Section, SettingsError, load, one_of_levels
from labelrm_common.version import VERSION

__all__ = ["AGENT", "HELP", "AgentSettings", "SettingsError", "load_agent_config"]

ENV_PREFIX = "LABELRM_AGENT_"
ISOLATION_MODES = ("cgroup", "none")
# docs/operations.md, "The work root": the users traverse the work root to their own
# directories; the state files (pids, users) are the agent's alone.
WORK_ROOT_MODE = 0o755
STATE_DIR_MODE = 0o700

RM = Section("rm", "The RM and this ECM's identity")
RESOURCES = Section("resources", "Resources offered")
LAUNCH = Section("launch", "EngineConn launches")
ISOLATION = Section("isolation", "Containing EngineConns (cgroups)")
TIMINGS = Section("timings", "Timings")
LOGGING = Section("logging", "Logs")
TLS = Section("tls", "Reaching the RM securely (security.md)")


@dataclass(frozen=True)
class AgentSettings:
    """Everything ecm-agent can be told; one declaration per setting."""

    rm: str = RM.setting(
        "127.0.0.1:7100", "the RM's address HOST:PORT (its agent_listen, or a load balancer)"
    )
    # Becomes the label emInstance=<agent_id>; filled in from the host name by the loader.
    agent_id: str = RM.setting(
        "",
        "the ECM instance name, also its emInstance label (default: short host name)",
        doc_default="the short host name",
    )
    labels: str = RM.setting(
        "", "key=value[,key=value...] matched against the placement labels of requests"
    )

    total_memory_bytes: int = RESOURCES.setting(
        0, "memory offered in bytes (0: MemTotal of /proc/meminfo)"
    )
    total_cpu_millis: int = RESOURCES.setting(
        0, "CPU offered in millicores (0: the CPU count x 1000)"
    )
    total_instances: int = RESOURCES.setting(64, "EngineConns at most")
    protected_memory_bytes: int = RESOURCES.setting(0, "memory kept for the host, never handed out")
    protected_cpu_millis: int = RESOURCES.setting(0, "CPU kept for the host, never handed out")

    work_root: Path = LAUNCH.setting(
        Path("/var/lib/labelrm/work"),
        "directory of the EngineConn work directories (created 0755 when missing)",
    )
    state_dir: Path = LAUNCH.setting(
        Path("/var/lib/labelrm/agent-state"),
        "one JSON file per running EngineConn (created 0700 when missing)",
    )
    allowed_users: str = LAUNCH.setting(
        "", "comma-separated users EngineConns may run as (empty: nobody)"
    )
    min_uid: int = LAUNCH.setting(1000, "lowest uid an EngineConn may run as (at least 1)")
    python: str = LAUNCH.setting(
        sys.executable,
        "the interpreter EngineConns run with (default: the agent's own)",
        doc_default="the agent's own interpreter",
    )
    # Users with a warm fork server at a time (ecm_agent/forkserver.py): their
    # `python -m engineconn` launches are forks of it instead of sudo + a cold start.
    fork_servers: int = LAUNCH.setting(
        8, "users with a warm fork server at a time (0: every launch a cold start)"
    )
    fork_server_idle: float = LAUNCH.setting(
        600.0, "seconds without a launch before a user's fork server is closed"
    )

    # Each EngineConn in a cgroup of its own (ecm_agent/containment.py): the granted
    # memory and CPU enforced, its usage measured, kill ending all of it. `none` is the
    # operator's explicit choice to run without (the RM shows it on the node).
    isolation: str = ISOLATION.setting(
        "cgroup",
        "`cgroup`: each EngineConn in its own cgroup (the agent refuses to start without"
        " one); `none`: no containment, no measured usage",
        choices=ISOLATION_MODES,
    )
    cgroup_root: Path = ISOLATION.setting(
        Path("/sys/fs/cgroup"), "where the cgroup hierarchies are mounted (v2, or v1 controllers)"
    )
    cgroup_parent: str = ISOLATION.setting(
        "",
        "the agent's cgroup for its EngineConns: relative to the agent's own cgroup, or"
        " absolute from each hierarchy's root (default: labelrm-<agent_id> under its own)",
        doc_default="labelrm-<agent_id>",
    )
    pids_max: int = ISOLATION.setting(4096, "processes and threads one EngineConn may have")
    usage_interval: float = ISOLATION.setting(
        5.0,
        "seconds between readings of each EngineConn's cgroup (memory, CPU, OOM kills);"
        " a heartbeat carries the newest",
    )

    heartbeat_interval: float = TIMINGS.setting(
        3.0, "seconds between heartbeats until the RM's answer sets it"
    )
    kill_grace: float = TIMINGS.setting(
        5.0, "seconds between TERM and KILL (the RM's kill command can say otherwise)"
    )

    log_level: str = LOGGING.setting("INFO", "DEBUG, INFO, WARNING or ERROR", check=one_of_levels)
    log_format: str = LOGGING.setting(
        "text",
        "`text` (logfmt key=value pairs) or `json` (one object per line), as rm-server",
        choices=LOG_FORMATS,
    )

    # tls_ca turns TLS on; tls_cert + tls_key are this agent's certificate (its CN / SAN
    # must be agent_id); or a bearer token (agent role).
    tls_ca: str = TLS.setting("", "PEM CA bundle verifying the RM; turns TLS on")
    tls_cert: str = TLS.setting(
        "", "this agent's certificate (PEM); its CN or a DNS SAN is agent_id"
    )
    tls_key: str = TLS.setting("", "this agent's private key (PEM)")
    # A secret: from the config file, LABELRM_AGENT_TOKEN or token_file (owner only), never
    # from a flag: the command line shows in `ps` to every local user.
    token: str = TLS.setting(
        "",
        "bearer token with the agent role (config file or environment only, never a flag)",
        secret=True,
        also_from=("--token-file",),
    )
    token_file: str = TLS.setting(
        "", "file holding the token (the agent's user only may read or write it)"
    )


def _finish(values: dict[str, Any], sources: Mapping[str, str]) -> None:
    """The host name as the default agent_id; the token read from token_file."""
    if not values["agent_id"]:
        values["agent_id"] = socket.gethostname().split(".")[0]
    if not values["cgroup_parent"]:
        # The agent id names the ECM: unique among the agents sharing a hierarchy.
        values["cgroup_parent"] = "labelrm-" + values["agent_id"].replace("/", "_")
    if values["token_file"]:
        try:
            values["token"] = read_token_file(Path(values["token_file"]))
        except ValueError as exc:
            raise SettingsError(str(exc)) from None


AGENT: Program[AgentSettings] = Program(
    prog="ecm-agent",
    settings=AgentSettings,
    description="labelrm ECM agent: registers this host with the RM and launches "
    "EngineConns as their users.",
    version=VERSION,
    env_prefix=ENV_PREFIX,
    finish=_finish,
)

HELP: dict[str, str] = {spec.name: spec.meta.help for spec in AGENT.specs}
"""The description of each setting (as --help, --print-config and the docs show it)."""

LoadedAgentConfig = Loaded[AgentSettings]


def load_agent_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> LoadedAgentConfig:
    """Parse the command line, the TOML file and the environment. Raises SettingsError
    (one line) for an unreadable file, an unknown key or a value of the wrong type."""
    return load(AGENT, argv, environ)


def load_agent_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> AgentSettings:
    """The effective settings (see `load_agent_config`)."""
    return load_agent_config(argv, environ).settings


def check_files(s: AgentSettings) -> None:
    """What the agent needs on this host before it registers, else SettingsError (one line):
    the TLS files readable, the work root and the state directory there (made when
    missing: `make_agent_dir`), the state directory writable, the EngineConn interpreter
    executable. An agent that registered without them would be RUNNING for the RM and
    fail every launch."""
    for name in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(s, name)
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise SettingsError(f"{name} {path}: {exc.strerror}") from None
    if bool(s.tls_cert) != bool(s.tls_key):
        raise SettingsError("tls_cert and tls_key go together: give both or neither")
    make_agent_dir("work_root", s.work_root, WORK_ROOT_MODE)
    make_agent_dir("state_dir", s.state_dir, STATE_DIR_MODE)
    if not os.access(s.state_dir, os.W_OK | os.X_OK):
        raise SettingsError(f"state_dir {s.state_dir}: not writable by this user")
    if not os.access(s.python, os.X_OK):
        raise SettingsError(f"python {s.python}: not an executable file")
    try:
        parse_labels(s.labels)
    except ValueError as exc:
        raise SettingsError(f"labels: {exc}") from None
    if s.pids_max < 16 or s.usage_interval <= 0:
        raise SettingsError("pids_max must be at least 16 and usage_interval above 0")


def make_agent_dir(name: str, path: Path, mode: int) -> None:
    """`path` (the setting `name`) as a directory: made the agent's with `mode`, whatever
    the umask, when it is missing, as Nomad and the kubelet make their data directories at
    start. Unlike theirs, its parent must exist (a unit's StateDirectory= makes it): a
    missing parent is refused (SettingsError, one line), more likely a typo or a disk not
    mounted than a tree to invent."""
    try:
        path.mkdir()
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise SettingsError(
            f"{name} {path}: its parent {path.parent} does not exist (create it, or fix {name})"
        ) from None
    except OSError as exc:
        raise SettingsError(f"{name} {path}: cannot create it: {exc.strerror}") from None
    else:
        path.chmod(mode)
    if not path.is_dir():
        raise SettingsError(f"{name} {path}: not a directory")


def read_token_file(path: Path) -> str:
    """The token in `path`, which must be a regular file of the agent's user that no
    one else may read or write (ValueError otherwise)."""
    try:
        info = path.stat()
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read token_file {path}: {exc}") from exc
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        raise ValueError(f"token_file {path} must be a regular file of the agent's user")
    if info.st_mode & 0o077:
        raise ValueError(
            f"token_file {path} is open to group or others (mode"
            f" {stat.S_IMODE(info.st_mode):04o}): chmod 600 it"
        )
    if not text or "\n" in text:
        raise ValueError(f"token_file {path} must hold one token")
    return text


def parse_labels(text: str) -> list[tuple[str, str]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"label {part!r} is not key=value")
        out.append((key, value))
    return out


def _meminfo_total() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def detect_total(s: AgentSettings) -> tuple[resource_pb2.Resource, resource_pb2.Resource]:
    """The ECM's total and protected resource (load_instance), detected where unset."""
    memory = s.total_memory_bytes or _meminfo_total()
    cpu = s.total_cpu_millis or (os.cpu_count() or 1) * 1000
    total = resource_pb2.Resource(
        load_instance=resource_pb2.LoadInstanceResource(
            memory_bytes=memory, cpu_millis=cpu, instances=s.total_instances
        )
    )
    protected = resource_pb2.Resource(
        load_instance=resource_pb2.LoadInstanceResource(
            memory_bytes=s.protected_memory_bytes, cpu_millis=s.protected_cpu_millis, instances=0
        )
    )
    return total, protected
