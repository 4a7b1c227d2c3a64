"""EngineConn settings: defaults < LABELRM_* environment < flags (no config file: the
agent's launch gives everything on the command line or in the environment).

Each setting is declared once below; the shared loader (labelrm_common/settings.py) derives
the flags, `--help`, `--print-config` and the table of docs/configuration.md. Kept free of
grpc and asyncio: the fork server imports it before it forks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engineconn import __version__
from engineconn.auth import SECRET_ENV, SECRET_FILE_ENV
from engineconn.engines import ENGINES
from labelrm_common.settings import Loaded, Program, Section, SettingsError, load_or_exit, positive

__all__ = ["ENGINECONN", "EngineConnSettings", "load_settings", "pairs"]

CREATION = Section("creation", "What the EngineConn is created as (set by the launch)")
RUNNING = Section("running", "How it runs")
SECURITY = Section("security", "TLS to the RM and the executor's secret (security.md)")


def _pairs_check(items: Any) -> str | None:
    try:
        pairs(items)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class EngineConnSettings:
    """Everything `python -m engineconn` can be told; one declaration per setting."""

    ec_id: str = CREATION.setting("", "the EngineConn's id", required=True)
    engine: str = CREATION.setting("", "the engine to run", choices=sorted(ENGINES), required=True)
    labels: tuple[str, ...] = CREATION.setting(
        (), "k=v, repeatable (environment: k=v,...)", flag="--label", check=_pairs_check
    )
    params: tuple[str, ...] = CREATION.setting(
        (), "k=v, repeatable (environment: k=v,...)", flag="--param", check=_pairs_check
    )

    rm: str = RUNNING.setting("", "RM host:port", required=True)
    listen: str = RUNNING.setting(
        "127.0.0.1:0", "executor address; port 0 = a free port", env="LABELRM_EC_LISTEN"
    )
    advertise_host: str = RUNNING.setting(
        "127.0.0.1", "host reported to the RM", env="LABELRM_EC_ADVERTISE_HOST"
    )
    max_idle_seconds: float = RUNNING.setting(
        600.0, "exit after this long without an execution; 0 = never"
    )
    heartbeat_interval: float = RUNNING.setting(
        3.0, "seconds between state reports", check=positive
    )

    # The RM issued the certificate for this id (material files of the launch). Empty:
    # plaintext. Absolute after loading: the launch names them relative to the work dir.
    tls_ca: str = SECURITY.setting("", "PEM file: the CA that verifies the RM")
    tls_cert: str = SECURITY.setting("", "PEM file: this EngineConn's certificate")
    tls_key: str = SECURITY.setting("", "PEM file: its private key")
    # The bearer token every executor call must carry; empty only with insecure_executor.
    executor_secret: str = SECURITY.setting(
        "",
        "the bearer token every executor call must carry (from the RM, never a flag)",
        env=SECRET_ENV,
        also_from=(SECRET_FILE_ENV,),
        secret=True,
        file=False,
        doc_default="the content of `executor_secret_file`",
    )
    # The launch by the RM writes the secret to a file: never in the launch script or the
    # environment of what the EngineConn runs.
    executor_secret_file: str = SECURITY.setting(
        "", "file holding `executor_secret` (read at start-up)", env=SECRET_FILE_ENV, flag=False
    )
    insecure_executor: bool = SECURITY.setting(
        False,
        f"serve the executor without {SECRET_ENV} (no authentication: any local user could "
        "run code as this user); for tests and development only",
        env=False,
    )


def _finish(values: dict[str, Any], sources: Mapping[str, str]) -> None:
    """The secret from its file, TLS in pairs and its paths made absolute."""
    if not values["executor_secret"] and (path := values["executor_secret_file"]):
        try:
            values["executor_secret"] = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"cannot read {SECRET_FILE_ENV}: {exc}") from None
    if not values["executor_secret"] and not values["insecure_executor"]:
        raise SettingsError(
            f"neither {SECRET_FILE_ENV} nor {SECRET_ENV} is set: the executor would run"
            " anyone's code as this user (launches by the RM set the file; --insecure-executor"
            " runs without authentication)"
        )
    if bool(values["tls_cert"]) != bool(values["tls_key"]):
        raise SettingsError("--tls-cert and --tls-key go together")
    for name in ("tls_ca", "tls_cert", "tls_key"):
        if values[name]:
            values[name] = os.path.abspath(values[name])


ENGINECONN: Program[EngineConnSettings] = Program(
    prog="python -m engineconn",
    settings=EngineConnSettings,
    description="An EngineConn: serves ExecutorService and reports its state to the RM.",
    version=__version__,
    env_prefix="LABELRM_",
    config_file=False,
    finish=_finish,
)


def load_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Loaded[EngineConnSettings]:
    """The effective settings; a bad one is one line on stderr and SystemExit(2)."""
    return load_or_exit(ENGINECONN, argv, environ)


def pairs(items: Sequence[str]) -> dict[str, str]:
    """k=v items as a dict; ValueError naming the first that is not one."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not key=value")
        out[key] = value
    return out
