"""rm-server settings: defaults < TOML file < LABELRM_* environment < flags.

`load_config` also records where each value came from, for `rm-server --print-config`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, NoReturn

from labelrm_common.logging import LOG_FORMATS
from labelrm_common.version import VERSION
from rm_server.settings_doc import RM_HELP

DEFAULT_RULES_SPEC = "userCreator+engineType;emInstance"

EVENT_LOOPS = ("uvloop", "asyncio")


@dataclass(frozen=True)
class Settings:
    listen: str = "127.0.0.1:7100"
    data_dir: Path = Path("labelrm-data")
    database_url: str = ""
    metrics_listen: str = ""
    # HOST:PORT of the web console (docs/operations.md); off when empty, on in dev mode
    console_listen: str = ""
    # Let several rm-server processes on this host listen on the same ports (the kernel
    # spreads connections over them): replicas on one host use more than one core.
    reuse_port: bool = False
    lock_timeout: float = 600.0
    sweep_interval: float = 1.0
    label_rules: str = DEFAULT_RULES_SPEC
    pool_min: int = 2
    pool_max: int = 16
    max_message_bytes: int = 4 * 1024 * 1024
    shutdown_grace: float = 10.0
    log_level: str = "INFO"
    log_format: str = "text"
    metrics_label_cap: int = 1000
    # Concurrent Apply / ReportUsed / Release share transactions (0: one per request)
    batch_max: int = 256
    batch_inflight: int = 1
    # Seconds a waiting Apply may hold capacity back from later requests (fairness).
    waiter_hold: float = 30.0
    # Ended tickets, EngineConns and demands are deleted this many days after they ended
    history_retention_days: float = 30.0
    # Request ids (idempotency records) are deleted this many hours after they were made
    request_id_retention_hours: float = 48.0
    # Agent heartbeats wait up to this many seconds to share a transaction
    heartbeat_linger: float = 0.005
    # "uvloop" (where installed; else asyncio's own, with a warning) or "asyncio"
    event_loop: str = "uvloop"
    # EngineConns and agents
    create_timeout: float = 60.0
    max_launch_attempts: int = 3
    ecm_expiry: float = 30.0
    ec_expiry: float = 30.0
    agent_heartbeat_interval: float = 3.0
    ec_heartbeat_interval: float = 3.0
    kill_grace: float = 5.0
    # Time-aware demands (docs/demands.md)
    demand_interval: float = 1.0  # seconds between planner rounds of one demand
    demand_lead_time: float = 60.0  # reserve capacity this long before a planned start
    demand_claim_timeout: float = 300.0  # an ALLOCATED demand not claimed: released, FAILED
    demand_loose_slip: float = 900.0  # how far a loose demand may slip past its window
    demand_default_duration: float = 3600.0  # planned hold without Duration or DeadLine
    # Security (docs/security.md). Without token_file and TLS, authentication is OFF
    # and every caller is an admin: allowed on loopback only.
    tls_cert: str = ""  # PEM certificate (chain) of the RM: TLS on every listener
    tls_key: str = ""
    tls_client_ca: str = ""  # CA bundle verifying client certificates (agents, EngineConns)
    agent_listen: str = ""  # HOST:PORT for agents and EngineConns, client certificate required
    tls_issuer_cert: str = ""  # CA that issues each EngineConn its certificate
    tls_issuer_key: str = ""
    tls_server_ca: str = ""  # CA bundle EngineConns verify the RM with (default: issuer)
    ec_cert_hours: float = 168.0  # lifetime of an EngineConn certificate
    token_file: str = ""  # bearer tokens: SHA-256 -> user, roles (rmctl token add)
    proxy_users: str = ""  # comma-separated users who may act on behalf of others
    insecure: bool = False  # allow a non-loopback listener without TLS
    # Take client certificates without a labelrm://agent/ identity (host certificates of
    # the operator's CA) as agents named by their CN / DNS names (docs/security.md)
    allow_host_certificates: bool = False
    # Only ECMs the node include list (RefreshNodes) names may register: the list denies
    # by default, and while it is empty no ECM is allowed
    node_include_required: bool = False
    apply_rate: float = 50.0  # apply-like calls per second and user (0: unlimited)
    apply_burst: int = 100
    call_rate: float = 200.0  # calls of any user RPC per second and user (0: unlimited)
    call_burst: int = 400
    # Largest request of a user RPC (agents' RPCs take up to max_message_bytes)
    user_max_message_bytes: int = 256 * 1024
    max_watch_streams: int = 16  # open health Watch streams per peer address (0: unlimited)
    max_waiting_applies: int = 32  # per user (0: unlimited)
    auth_failure_limit: int = 10  # failed authentications per peer within the window
    auth_failure_window: float = 60.0


Source = Literal["default", "file", "env", "flag"]


def _coerce(name: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in fields(Settings)}[name]
    if kind in ("bool", bool):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"not a boolean: {raw!r}")
        return text in ("true", "1", "yes")
    if kind in ("float", float):
        return float(raw)
    if kind in ("int", int):
        return int(raw)
    if kind in ("Path", Path):
        return Path(raw)
    return str(raw)


@dataclass(frozen=True)
class LoadedConfig:
    """The effective settings, where each came from, and what the command line asked."""

    settings: Settings
    sources: dict[str, Source] = field(default_factory=dict)
    config_file: str = ""
    print_config: bool = False
    dev: bool = False
    dev_tls: bool = False

    def describe(self) -> str:
        """The effective configuration as TOML, each value annotated with its source."""
        lines = ["# rm-server effective configuration (source: default < file < env < flag)"]
        if self.config_file:
            lines.append(f"# config file: {self.config_file}")
        for f in fields(Settings):
            value = getattr(self.settings, f.name)
            if f.name == "database_url":
                value = redact_url(value)
            rendered = _toml_value(str(value) if isinstance(value, Path) else value)
            env = "LABELRM_" + f.name.upper()
            flag = "--" + f.name.replace("_", "-")
            source = self.sources.get(f.name, "default")
            lines.append(f"{f.name} = {rendered}  # {source} ({env}, {flag})")
        return "\n".join(lines)


def redact_url(url: str) -> str:
    """The database URL with its password (URL or key=value form) replaced by ***."""
    url = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (not the usage of every setting):
    ``PROG: error: MESSAGE (PROG --help lists the settings)``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print `message` on one line to stderr and exit 2."""
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the settings)\n")


def build_parser() -> argparse.ArgumentParser:
    """rm-server's command line: one flag per setting, with its description."""
    parser = OneLineErrorParser(
        prog="rm-server",
        description="labelrm resource manager. Settings: defaults < --config TOML < "
        "LABELRM_<NAME> environment < flags (docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=f"rm-server {VERSION}")
    parser.add_argument("--config", help="TOML file with settings (or $LABELRM_CONFIG)")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration with the source of each value, and exit",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="also start one local agent (dev mode: embedded database, loopback only)",
    )
    parser.add_argument(
        "--dev-tls",
        action="store_true",
        help="with --dev: TLS, certificates and an admin token, from a throwaway CA",
    )
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        text = f"{RM_HELP.get(f.name, '')} [LABELRM_{f.name.upper()}]"
        if f.type in ("bool", bool):  # a switch: `--insecure`
            parser.add_argument(
                flag, dest=f.name, action="store_const", const=True, default=None, help=text
            )
        else:
            parser.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(), help=text)
    return parser


def load_config(
    argv: list[str] | None = None, environ: dict[str, str] | None = None
) -> LoadedConfig:
    """Parse the command line, the TOML file and the environment into `LoadedConfig`."""
    env = os.environ if environ is None else environ
    parser = build_parser()
    args = parser.parse_args(argv)
    names = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}

    def put(name: str, raw: Any, source: Source, where: str) -> None:
        try:
            values[name] = _coerce(name, raw)
        except ValueError:
            parser.error(f"invalid value {raw!r} for {name} ({where})")
        sources[name] = source

    config_file = args.config or env.get("LABELRM_CONFIG") or ""
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                table = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            parser.error(f"cannot read config file {config_file}: {exc}")
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in names:
                parser.error(f"unknown setting {key!r} in {config_file}")
            put(name, raw, "file", config_file)
    for f in fields(Settings):
        raw = env.get("LABELRM_" + f.name.upper())
        if raw is not None:
            put(f.name, raw, "env", "LABELRM_" + f.name.upper())
        flag = getattr(args, f.name)
        if flag is not None:
            put(f.name, flag, "flag", "--" + f.name.replace("_", "-"))
    if values.get("log_format", "text") not in LOG_FORMATS:
        parser.error(f"log_format must be one of {', '.join(LOG_FORMATS)}")
    if values.get("event_loop", "uvloop") not in EVENT_LOOPS:
        parser.error(f"event_loop must be one of {', '.join(EVENT_LOOPS)}")
    return LoadedConfig(
        Settings(**values),
        sources,
        config_file,
        bool(args.print_config),
        bool(args.dev),
        bool(args.dev_tls),
    )
