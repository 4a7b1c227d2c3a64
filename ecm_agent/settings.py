"""ecm-agent settings: defaults < TOML file < LABELRM_AGENT_* environment < flags."""

from __future__ import annotations

import argparse
import json
import os
import socket
import stat
import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from labelrm.v1 import resource_pb2

ENV_PREFIX = "LABELRM_AGENT_"


@dataclass(frozen=True)
class AgentSettings:
    rm: str = "127.0.0.1:7100"
    agent_id: str = ""  # default: the host name; becomes the label emInstance=<agent_id>
    labels: str = ""  # "cluster=c1,tenant=t1": matched against requests' labels
    total_memory_bytes: int = 0  # 0: detected from /proc/meminfo
    total_cpu_millis: int = 0  # 0: detected from the CPU count
    total_instances: int = 64
    protected_memory_bytes: int = 0
    protected_cpu_millis: int = 0
    work_root: Path = Path("/var/lib/labelrm/work")
    state_dir: Path = Path("/var/lib/labelrm/agent-state")
    allowed_users: str = ""  # comma-separated; nobody else runs anything
    min_uid: int = 1000
    heartbeat_interval: float = 3.0
    kill_grace: float = 5.0
    python: str = sys.executable  # the interpreter EngineConns run with
    # Users with a warm fork server at a time (ecm_agent/forkserver.py): their
    # `python -m engineconn` launches are forks of it instead of sudo + a cold start.
    # 0: every launch goes through sudo and a fresh interpreter.
    fork_servers: int = 8
    fork_server_idle: float = 600.0  # seconds without a launch before one is closed
    log_level: str = "INFO"
    log_format: str = "text"  # text (logfmt) or json: the same lines as rm-server's
    # Reaching the RM (docs/security.md): tls_ca turns TLS on; tls_cert + tls_key are this
    # agent's certificate (its CN / SAN must be agent_id); or a bearer token (agent role).
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # The token comes from the config file, LABELRM_AGENT_TOKEN or token_file (owner
    # only), never from a flag: the command line shows in `ps` to every local user.
    token: str = field(default="", repr=False)
    token_file: str = ""


HELP: dict[str, str] = {
    "rm": "the RM's address HOST:PORT (its agent_listen, or a load balancer)",
    "agent_id": "the ECM instance name, also its emInstance label (default: short host name)",
    "labels": "key=value[,key=value...] matched against the placement labels of requests",
    "total_memory_bytes": "memory offered in bytes (0: MemTotal of /proc/meminfo)",
    "total_cpu_millis": "CPU offered in millicores (0: the CPU count x 1000)",
    "total_instances": "EngineConns at most",
    "protected_memory_bytes": "memory kept for the host, never handed out",
    "protected_cpu_millis": "CPU kept for the host, never handed out",
    "work_root": "directory of the EngineConn work directories (must exist)",
    "state_dir": "one JSON file per running EngineConn (created 0700 when missing)",
    "allowed_users": "comma-separated users EngineConns may run as (empty: nobody)",
    "min_uid": "lowest uid an EngineConn may run as (at least 1)",
    "heartbeat_interval": "seconds between heartbeats until the RM's answer sets it",
    "kill_grace": "seconds between TERM and KILL (the RM's kill command can say otherwise)",
    "python": "the interpreter EngineConns run with (default: the agent's own)",
    "fork_servers": "users with a warm fork server at a time (0: every launch a cold start)",
    "fork_server_idle": "seconds without a launch before a user's fork server is closed",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "log_format": "`text` (logfmt key=value pairs) or `json` (one object per line), as rm-server",
    "tls_ca": "PEM CA bundle verifying the RM; turns TLS on",
    "tls_cert": "this agent's certificate (PEM); its CN or a DNS SAN is agent_id",
    "tls_key": "this agent's private key (PEM)",
    "token": "bearer token with the agent role (config file or environment only, never a flag)",
    "token_file": "file holding the token (the agent's user only may read or write it)",
}
"""One line per setting: the flag's --help text, --print-config's comment and the table of
docs/configuration.md (a test checks that every setting has one)."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class SettingsError(ValueError):
    """A setting that cannot be used: ecm-agent prints it as one line and exits 2."""


def _coerce(kind: Any, raw: Any) -> Any:
    if kind in ("int", int):
        return int(raw)
    if kind in ("float", float):
        return float(raw)
    if kind in ("Path", Path):
        return Path(raw)
    return str(raw)


def build_parser() -> argparse.ArgumentParser:
    """ecm-agent's command line: one flag per setting, with its description."""
    from ecm_agent import __version__
    from rm_server.config import OneLineErrorParser

    parser = OneLineErrorParser(
        prog="ecm-agent",
        description="labelrm ECM agent: registers this host with the RM and launches "
        "EngineConns as their users. Settings: defaults < --config TOML < "
        f"{ENV_PREFIX}<NAME> environment < flags.",
    )
    parser.add_argument("--config", help="TOML file with settings (keys: the setting names)")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration with the source of each value, and exit",
    )
    parser.add_argument("--version", action="version", version=f"ecm-agent {__version__}")
    for f in fields(AgentSettings):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            help=f"{HELP.get(f.name, '')} [{ENV_PREFIX}{f.name.upper()}]",
        )
    return parser


@dataclass(frozen=True)
class LoadedAgentConfig:
    """The effective settings, where each came from, and whether to print them."""

    settings: AgentSettings
    sources: dict[str, str]
    config_file: str = ""
    print_config: bool = False

    def describe(self) -> str:
        """The effective configuration as TOML, each value annotated with its source."""
        lines = ["# ecm-agent effective configuration (source: default < file < env < flag)"]
        if self.config_file:
            lines.append(f"# config file: {self.config_file}")
        for f in fields(AgentSettings):
            value = getattr(self.settings, f.name)
            if f.name == "token" and value:
                value = "***"
            text = repr(value) if isinstance(value, int | float) else json.dumps(str(value))
            env = ENV_PREFIX + f.name.upper()
            flag = "--" + f.name.replace("_", "-")
            source = self.sources.get(f.name, "default")
            lines.append(f"{f.name} = {text}  # {source} ({env}, {flag})")
        return "\n".join(lines)


def load_agent_config(
    argv: list[str] | None = None, environ: dict[str, str] | None = None
) -> LoadedAgentConfig:
    """Parse the command line, the TOML file and the environment. Raises SettingsError
    (one line) for an unreadable file, an unknown key or a value of the wrong type."""
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    if args.token is not None:
        raise SettingsError(
            "--token would show the token to every local user (ps): set LABELRM_AGENT_TOKEN,"
            " token in the config file, or --token-file"
        )
    kinds = {f.name: f.type for f in fields(AgentSettings)}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(name: str, raw: Any, source: str, where: str) -> None:
        try:
            values[name] = _coerce(kinds[name], raw)
        except (TypeError, ValueError):
            raise SettingsError(f"invalid value {raw!r} for {name} ({where})") from None
        sources[name] = source

    if args.config:
        try:
            with open(args.config, "rb") as fh:
                table = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"cannot read config file {args.config}: {exc}") from None
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in kinds:
                raise SettingsError(f"unknown setting {key!r} in {args.config}")
            put(name, raw, "file", args.config)
    for name in kinds:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            put(name, raw, "env", ENV_PREFIX + name.upper())
        if getattr(args, name) is not None:
            put(name, getattr(args, name), "flag", "--" + name.replace("_", "-"))
    if not values.get("agent_id"):
        values["agent_id"] = socket.gethostname().split(".")[0]
    if values.get("token_file"):
        try:
            values["token"] = read_token_file(Path(values["token_file"]))
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
    level = str(values.get("log_level", "INFO")).upper()
    if level not in LOG_LEVELS:
        raise SettingsError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    if values.get("log_format", "text") not in ("text", "json"):
        raise SettingsError(f"log_format must be text or json, not {values['log_format']!r}")
    return LoadedAgentConfig(
        AgentSettings(**values), sources, args.config or "", bool(args.print_config)
    )


def load_agent_settings(
    argv: list[str] | None = None, environ: dict[str, str] | None = None
) -> AgentSettings:
    """The effective settings (see `load_agent_config`)."""
    return load_agent_config(argv, environ).settings


def check_files(s: AgentSettings) -> None:
    """What the agent needs on this host before it registers, else SettingsError (one line):
    the TLS files readable, the work root a directory, the state directory usable (created
    0700 if missing), the EngineConn interpreter executable. An agent that registered
    without them would be RUNNING for the RM and fail every launch."""
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
    if not s.work_root.is_dir():
        raise SettingsError(f"work_root {s.work_root}: not a directory (create it first)")
    try:
        s.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(f"state_dir {s.state_dir}: cannot create it: {exc.strerror}") from None
    if not os.access(s.state_dir, os.W_OK | os.X_OK):
        raise SettingsError(f"state_dir {s.state_dir}: not writable by this user")
    if not os.access(s.python, os.X_OK):
        raise SettingsError(f"python {s.python}: not an executable file")
    try:
        parse_labels(s.labels)
    except ValueError as exc:
        raise SettingsError(f"labels: {exc}") from None


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
