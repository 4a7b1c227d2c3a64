"""`rm-server --dev --dev-tls`: dev mode with the production security set-up, on
loopback: a throwaway CA under ``<data_dir>/pki`` (kept across restarts), a fresh server
and agent certificate, EngineConn certificates issued by the same CA, the local agent
on a mutual-TLS listener, and a new admin token printed at start-up."""

from __future__ import annotations

import getpass
from dataclasses import dataclass, replace
from pathlib import Path

from labelrm_common import pki, tokens
from rm_server.config import Settings

DEV_AGENT = "local-agent"
DEV_ADMIN_NOTE = "rm-server --dev-tls"


@dataclass(frozen=True)
class DevTls:
    settings: Settings
    agent_args: tuple[str, ...]  # ecm-agent flags: its CA, certificate and key
    ca: Path
    admin_token: str


def prepare(settings: Settings) -> DevTls:
    """Create (or refresh) the dev PKI and token file; the settings that use them."""
    data = Path(settings.data_dir).resolve()
    directory = data / "pki"
    pki.dev_pki(directory, DEV_AGENT, days=30)
    token_file = data / "tokens.toml"
    admin = getpass.getuser()
    if token_file.exists():  # one dev admin token at a time: the previous one is revoked
        tokens.revoke(token_file, user=admin)
    token = tokens.add_token(token_file, admin, ["admin", "user"], DEV_ADMIN_NOTE)
    ca = directory / "ca.crt"
    agent_crt, agent_key = (
        directory / f"{pki.file_stem('agent', DEV_AGENT)}.{ext}" for ext in ("crt", "key")
    )
    secured = replace(
        settings,
        tls_cert=str(directory / "server.crt"),
        tls_key=str(directory / "server.key"),
        tls_client_ca=str(ca),
        agent_listen="127.0.0.1:0",
        tls_issuer_cert=str(ca),
        tls_issuer_key=str(directory / "ca.key"),
        token_file=str(token_file),
    )
    args = ("--tls-ca", str(ca), "--tls-cert", str(agent_crt), "--tls-key", str(agent_key))
    return DevTls(secured, args, ca, token)
