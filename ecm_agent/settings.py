"""ecm-agent settings: defaults < TOML file < LABELRM_AGENT_* environment < flags."""

from __future__ import annotations

import argparse
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
    # Reaching the RM (docs/security.md): tls_ca turns TLS on; tls_cert + tls_key are this
    # agent's certificate (its CN / SAN must be agent_id); or a bearer token (agent role).
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # The token comes from the config file, LABELRM_AGENT_TOKEN or token_file (owner
    # only), never from a flag: the command line shows in `ps` to every local user.
    token: str = field(default="", repr=False)
    token_file: str = ""


def _coerce(kind: Any, raw: Any) -> Any:
    if kind in ("int", int):
        return int(raw)
    if kind in ("float", float):
        return float(raw)
    if kind in ("Path", Path):
        return Path(raw)
    return str(raw)


def load_agent_settings(
    argv: list[str] | None = None, environ: dict[str, str] | None = None
) -> AgentSettings:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="ecm-agent", description="labelrm ECM agent")
    parser.add_argument("--config", help="TOML file with settings")
    for f in fields(AgentSettings):
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None)
    args = parser.parse_args(argv)
    if args.token is not None:
        parser.error(
            "--token would show the token to every local user (ps): set LABELRM_AGENT_TOKEN,"
            " token in the config file, or --token-file"
        )
    kinds = {f.name: f.type for f in fields(AgentSettings)}
    values: dict[str, Any] = {}
    if args.config:
        with open(args.config, "rb") as fh:
            for key, raw in tomllib.load(fh).items():
                name = key.replace("-", "_")
                if name not in kinds:
                    parser.error(f"unknown setting {key!r} in {args.config}")
                values[name] = _coerce(kinds[name], raw)
    for name, kind in kinds.items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(kind, raw)
        if getattr(args, name) is not None:
            values[name] = _coerce(kind, getattr(args, name))
    if not values.get("agent_id"):
        values["agent_id"] = socket.gethostname().split(".")[0]
    if values.get("token_file"):
        try:
            values["token"] = read_token_file(Path(values["token_file"]))
        except ValueError as exc:
            parser.error(str(exc))
    return AgentSettings(**values)


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
