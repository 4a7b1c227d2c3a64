"""What each setting of rm-server and ecm-agent means, in one place.

The same text is the flag's `--help`, and the tables of docs/configuration.md are generated
from it with the defaults of the settings classes (`python -m rm_server.settings_doc
--write docs/configuration.md`, or `make docs`); a test checks that every setting has a
description and that the file is up to date.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

__all__ = ["RM_HELP", "render_tables", "update_file"]

RM_HELP: dict[str, str] = {
    "listen": "gRPC address HOST:PORT for users and operators; beyond loopback only with "
    "authentication, and with TLS or `insecure` (security.md)",
    "data_dir": "directory of the embedded PostgreSQL (`<data_dir>/pgdata`, relative to the "
    "working directory); unused with `database_url`",
    "database_url": "libpq URL of an external PostgreSQL (empty: the embedded one); "
    "multi-host with `target_session_attrs=read-write` for HA",
    "metrics_listen": "Prometheus endpoint HOST:PORT, served at /metrics (empty: off)",
    "console_listen": "HOST:PORT of the web console (operations.md); off when empty, on in "
    "dev mode",
    "reuse_port": "several rm-server processes on this host share the listen ports "
    "(SO_REUSEPORT), so replicas on one host use more cores",
    "lock_timeout": "seconds a LOCKED ticket may stay unreported before the sweep reclaims it",
    "sweep_interval": "seconds between background sweeps (lock expiry, stale waiters, old "
    "request ids)",
    "label_rules": "resource-carrying label rules: rules separated by `;`, the keys of a "
    "combined label by `+`",
    "pool_min": "minimum database connections in the pool",
    "pool_max": "maximum database connections in the pool (plus one LISTEN connection)",
    "max_message_bytes": "largest gRPC message received or sent",
    "shutdown_grace": "seconds in-flight calls get to finish after SIGTERM",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "log_format": "`text` (logfmt key=value pairs) or `json` (one object per line); either "
    "way one event per line, with request_id, peer and method during an RPC",
    "metrics_label_cap": "at most this many label records get per-label gauges",
    "batch_max": "concurrent Apply / ReportUsed / Release requests grouped into one "
    "transaction (0: one transaction per request)",
    "batch_inflight": "grouped transactions in flight per process",
    "waiter_hold": "seconds a waiting Apply may hold capacity back from later requests "
    "(architecture.md, Waiting applies and fairness)",
    "history_retention_days": "ended tickets, EngineConns and demands are deleted this many "
    "days after they ended",
    "request_id_retention_hours": "request ids (idempotency records) are deleted this many "
    "hours after they were made",
    "heartbeat_linger": "seconds an agent heartbeat may wait for others to share its transaction",
    "event_loop": "`uvloop` (asyncio's own loop, with a warning, where it is missing) or `asyncio`",
    "create_timeout": "seconds CreateEngineConn waits for ready unless the request says",
    "max_launch_attempts": "ECMs tried before CreateEngineConn gives up",
    "ecm_expiry": "an agent silent this many seconds is LOST and its EngineConns released",
    "ec_expiry": "an EngineConn silent this many seconds is LOST, killed and released",
    "agent_heartbeat_interval": "seconds between agent heartbeats, told to the agents",
    "ec_heartbeat_interval": "seconds between EngineConn reports, told to the EngineConns",
    "kill_grace": "seconds between TERM and KILL when an EngineConn is stopped",
    "demand_interval": "seconds between planner rounds of one demand (demands.md)",
    "demand_lead_time": "seconds before a planned start that capacity is reserved",
    "demand_claim_timeout": "seconds an ALLOCATED demand may stay unclaimed before it is "
    "released and FAILED",
    "demand_loose_slip": "seconds a loose demand may slip past its window",
    "demand_default_duration": "seconds a demand is planned to hold without Duration or DeadLine",
    "tls_cert": "PEM certificate (chain) of the RM: TLS on every listener; re-read when it "
    "changes. It (or `token_file`) turns authentication on",
    "tls_key": "the private key of `tls_cert` (PEM)",
    "tls_client_ca": "CA bundle verifying client certificates (agents, EngineConns; users too "
    "when there is no `agent_listen`)",
    "agent_listen": "second address HOST:PORT for agents and EngineConns: TLS with a client "
    "certificate required (empty: none)",
    "tls_issuer_cert": "CA that issues each EngineConn its certificate at launch",
    "tls_issuer_key": "the private key of `tls_issuer_cert`",
    "tls_server_ca": "CA bundle handed to EngineConns to verify the RM (empty: the issuing CA)",
    "ec_cert_hours": "lifetime of an EngineConn certificate in hours",
    "token_file": "bearer tokens: SHA-256 hash -> user and roles (`rmctl token add`); "
    "re-read when it changes",
    "proxy_users": "comma-separated users who may act on behalf of others on the user RPCs",
    "insecure": "allow a non-loopback `listen` without TLS (authentication is still required)",
    "allow_host_certificates": "take client certificates without a labelrm agent identity "
    "(host certificates of the operator's CA) as agents named by their CN or DNS names",
    "node_include_required": "only ECMs the node include list (RefreshNodes) names may "
    "register: the list denies by default, and while it is empty no ECM is allowed",
    "apply_rate": "apply-like calls (Apply, Create/AskEngineConn, SubmitDemand) per second "
    "and user (0: unlimited; admins exempt)",
    "apply_burst": "burst of `apply_rate`",
    "call_rate": "calls of any user RPC per second and user (0: unlimited)",
    "call_burst": "burst of `call_rate`",
    "user_max_message_bytes": "largest request of a user RPC (agents' RPCs take up to "
    "`max_message_bytes`)",
    "max_watch_streams": "open health Watch streams per peer address (0: unlimited)",
    "max_waiting_applies": "Applies per user waiting for capacity at once (0: unlimited)",
    "auth_failure_limit": "invalid tokens from one address within `auth_failure_window` "
    "after which its tokens are refused unchecked",
    "auth_failure_window": "seconds of `auth_failure_limit`",
}

BEGIN = "<!-- settings tables: generated by `make docs` from rm_server/settings_doc.py -->"
END = "<!-- end of generated settings tables -->"


def _default(f: Any) -> str:
    value = f.default if f.default is not MISSING else f.default_factory()
    if f.name == "python":
        return "the agent's own interpreter"
    if f.name == "agent_id":
        return "the short host name"
    if value == "" or value is None:
        return "empty"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def _table(cls: type, helps: dict[str, str], env_prefix: str) -> list[str]:
    rows = [
        "| setting / TOML key | default | environment | flag | meaning |",
        "|---|---|---|---|---|",
    ]
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        env = env_prefix + f.name.upper()
        meaning = helps.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{f.name}` | {_default(f)} | `{env}` | `{flag}` | {meaning} |")
    return rows


def render_tables() -> str:
    """The generated part of docs/configuration.md: one table per daemon."""
    from ecm_agent.settings import ENV_PREFIX, HELP, AgentSettings
    from rm_server.config import Settings

    lines = [BEGIN, "", "### rm-server", ""]
    lines += _table(Settings, RM_HELP, "LABELRM_")
    lines += ["", "### ecm-agent", ""]
    lines += _table(AgentSettings, HELP, ENV_PREFIX)
    lines += ["", END]
    return "\n".join(lines)


def update_file(text: str) -> str:
    """`text` (docs/configuration.md) with its generated part replaced."""
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise ValueError(f"no {BEGIN!r} marker")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise ValueError(f"no {END!r} marker")
    return head + render_tables() + tail


def main(argv: list[str] | None = None) -> int:
    """Print the tables, or rewrite them in place in a file (--write FILE)."""
    parser = argparse.ArgumentParser(prog="python -m rm_server.settings_doc")
    parser.add_argument("--write", type=Path, metavar="FILE", help="update FILE in place")
    args = parser.parse_args(argv)
    if args.write is None:
        print(render_tables())
        return 0
    args.write.write_text(update_file(args.write.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
