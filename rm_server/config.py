"""rm-server settings: defaults < TOML file < LABELRM_* environment < flags."""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_RULES_SPEC = "userCreator+engineType;emInstance"


@dataclass(frozen=True)
class Settings:
    listen: str = "127.0.0.1:7100"
    data_dir: Path = Path("labelrm-data")
    database_url: str = ""
    metrics_listen: str = ""
    lock_timeout: float = 600.0
    sweep_interval: float = 1.0
    label_rules: str = DEFAULT_RULES_SPEC
    pool_min: int = 2
    pool_max: int = 16
    max_message_bytes: int = 4 * 1024 * 1024
    shutdown_grace: float = 10.0
    log_level: str = "INFO"


def _coerce(name: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in fields(Settings)}[name]
    if kind in ("float", float):
        return float(raw)
    if kind in ("int", int):
        return int(raw)
    if kind in ("Path", Path):
        return Path(raw)
    return str(raw)


def load_settings(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="rm-server", description="labelrm resource manager")
    parser.add_argument("--config", help="TOML file with settings")
    for f in fields(Settings):
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    config_file = args.config or env.get("LABELRM_CONFIG")
    if config_file:
        with open(config_file, "rb") as fh:
            table = tomllib.load(fh)
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in {f.name for f in fields(Settings)}:
                parser.error(f"unknown setting {key!r} in {config_file}")
            values[name] = _coerce(name, raw)
    for f in fields(Settings):
        raw = env.get("LABELRM_" + f.name.upper())
        if raw is not None:
            values[f.name] = _coerce(f.name, raw)
        flag = getattr(args, f.name)
        if flag is not None:
            values[f.name] = _coerce(f.name, flag)
    return Settings(**values)
