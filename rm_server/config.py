"""rm-server settings: defaults < TOML file < LABELRM_* environment < flags.

Each setting is declared once below (type, default, description, validation); the shared
loader (labelrm_common/settings.py) derives the flag, the environment variable, the
config-file key, `--help`, `--print-config` and the tables of docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from labelrm_common.logging import LOG_FORMATS
from labelrm_common.settings import (
    Loaded,
    Program,
    Section,
    SettingsError,
    load_or_exit,
    one_of_levels,
    positive,
    redact_url,
)
from labelrm_common.version import VERSION

__all__ = ["RM_SERVER", "LoadedConfig", "Settings", "SettingsError", "load_config", "redact_url"]

DEFAULT_RULES_SPEC = "userCreator+engineType;emInstance"

EVENT_LOOPS = ("uvloop", "asyncio")

SERVER = Section("server", "Listeners and the process")
DATABASE = Section("database", "Database")
LOGGING = Section("logging", "Logs and metrics")
TIMINGS = Section("timings", "Sweeps, holds and retention")
BATCHING = Section("batching", "Batching")
ENGINECONNS = Section("engineconns", "EngineConns and agents")
DEMANDS = Section("demands", "Time-aware demands (demands.md)")
TLS = Section("tls", "Security: TLS, tokens and who may register (security.md)")
LIMITS = Section("limits", "Abuse limits, per user and RM process")


def _share(value: float) -> str | None:
    """A `check`: a share of a whole, above 0 and at most 1."""
    return None if 0 < value <= 1 else f"must be above 0 and at most 1, not {value!r}"


def _at_least_two(value: int) -> str | None:
    """A `check`: 2 or more (so that one agent alone is never a crowd)."""
    return None if value >= 2 else f"must be at least 2, not {value!r}"


@dataclass(frozen=True)
class Settings:
    """Everything rm-server can be told; one declaration per setting."""

    listen: str = SERVER.setting(
        "127.0.0.1:7100",
        "gRPC address HOST:PORT for users and operators; beyond loopback only with "
        "authentication, and with TLS or `insecure` (security.md)",
    )
    console_listen: str = SERVER.setting(
        "", "HOST:PORT of the web console (operations.md); off when empty, on in dev mode"
    )
    console_refresh: float = SERVER.setting(
        2.0,
        "seconds the web console keeps a view it computed for everyone who looks: the RM "
        "computes each view at most once per period, however many browsers poll it",
        check=positive,
    )
    console_list_rows: int = SERVER.setting(
        5000,
        "rows of a kind the web console reads for one list (newest first); a longer list "
        "says it is cut and how to narrow it",
        check=positive,
    )
    provider_secrets_dir: str = SERVER.setting(
        "",
        "directory of external providers' passwords, one file per secret named by a "
        "provider's `password_secret` (else the environment variable "
        "LABELRM_PROVIDER_SECRET_<NAME>); read at each fetch (security.md)",
    )
    console_hosts: str = SERVER.setting(
        "",
        "host names the console also answers to in the Host header, comma-separated (the "
        "name users open it at, when it listens on a wildcard or another address); "
        "others are refused, against DNS rebinding (security.md)",
    )
    metrics_listen: str = SERVER.setting(
        "", "Prometheus endpoint HOST:PORT, served at /metrics (empty: off)"
    )
    # Replicas on one host use more than one core: the kernel spreads connections.
    reuse_port: bool = SERVER.setting(
        False,
        "several rm-server processes on this host share the listen ports (SO_REUSEPORT), "
        "so replicas on one host use more cores",
    )
    label_rules: str = SERVER.setting(
        DEFAULT_RULES_SPEC,
        "resource-carrying label rules: rules separated by `;`, the keys of a combined "
        "label by `+`",
    )
    max_message_bytes: int = SERVER.setting(
        4 * 1024 * 1024, "largest gRPC message received or sent"
    )
    agent_process: bool = SERVER.setting(
        True,
        "with `agent_listen`: serve it, and judge agents' and EngineConns' liveness, in a "
        "process of its own, so that no user's traffic can delay them (architecture.md, "
        "Which work runs where); off: one process does everything",
    )
    shutdown_grace: float = SERVER.setting(
        10.0, "seconds in-flight calls get to finish after SIGTERM"
    )
    event_loop: str = SERVER.setting(
        "uvloop",
        "`uvloop` (asyncio's own loop, with a warning, where it is missing) or `asyncio`",
        choices=EVENT_LOOPS,
    )

    data_dir: Path = DATABASE.setting(
        Path("labelrm-data"),
        "directory of the embedded PostgreSQL (`<data_dir>/pgdata`, relative to the working "
        "directory); unused with `database_url`",
    )
    database_url: str = DATABASE.setting(
        "",
        "libpq URL of an external PostgreSQL (empty: the embedded one); multi-host with "
        "`target_session_attrs=read-write` for HA",
        redact=redact_url,  # --print-config shows the URL, not its password
    )
    pool_min: int = DATABASE.setting(2, "minimum database connections in the pool")
    pool_max: int = DATABASE.setting(
        16, "maximum database connections in the pool (plus one LISTEN connection)"
    )
    statement_timeout: float = DATABASE.setting(
        5.0,
        "seconds a database transaction may take, retries included: each statement's "
        "statement_timeout, and the bound after which rm-server abandons the transaction "
        "and answers UNAVAILABLE (a frozen or unreachable primary stalls no call longer)",
    )
    report_timeout: float = DATABASE.setting(
        60.0,
        "the same bound for the transactions that read or delete in bulk "
        "(CheckConsistency, the cluster overview, retention)",
    )

    log_level: str = LOGGING.setting("INFO", "DEBUG, INFO, WARNING or ERROR", check=one_of_levels)
    log_format: str = LOGGING.setting(
        "text",
        "`text` (logfmt key=value pairs) or `json` (one object per line); either way one "
        "event per line, with request_id, peer and method during an RPC",
        choices=LOG_FORMATS,
    )
    metrics_label_cap: int = LOGGING.setting(
        1000, "at most this many label records get per-label gauges"
    )

    lock_timeout: float = TIMINGS.setting(
        600.0, "seconds a LOCKED ticket may stay unreported before the sweep reclaims it"
    )
    sweep_interval: float = TIMINGS.setting(
        1.0, "seconds between background sweeps (lock expiry, stale waiters, old request ids)"
    )
    waiter_hold: float = TIMINGS.setting(
        30.0,
        "seconds a waiting Apply may hold capacity back from later requests "
        "(architecture.md, Waiting applies and fairness)",
    )
    history_retention_days: float = TIMINGS.setting(
        30.0,
        "ended tickets, EngineConns and demands are deleted this many days after they ended,"
        " a node's events this many days after they happened",
    )
    usage_interval: float = TIMINGS.setting(
        10.0,
        "seconds between roll-ups of ended tickets, EngineConns and demands into the usage"
        " ledger (operations.md, Usage and show-back)",
    )
    request_id_retention_hours: float = TIMINGS.setting(
        48.0,
        "request ids (idempotency records) are deleted this many hours after they were made",
    )

    # Concurrent Apply / ReportUsed / Release share transactions (0: one per request).
    batch_max: int = BATCHING.setting(
        256,
        "concurrent Apply / ReportUsed / Release requests grouped into one transaction "
        "(0: one transaction per request)",
    )
    batch_inflight: int = BATCHING.setting(1, "grouped transactions in flight per process")
    heartbeat_linger: float = BATCHING.setting(
        0.005, "seconds an agent heartbeat may wait for others to share its transaction"
    )

    create_timeout: float = ENGINECONNS.setting(
        60.0, "seconds CreateEngineConn waits for ready unless the request says"
    )
    max_launch_attempts: int = ENGINECONNS.setting(3, "ECMs tried before CreateEngineConn gives up")
    ecm_expiry: float = ENGINECONNS.setting(
        30.0, "an agent silent this many seconds is LOST and its EngineConns released"
    )
    ec_expiry: float = ENGINECONNS.setting(
        30.0, "an EngineConn silent this many seconds is LOST, killed and released"
    )
    disruption_share: float = ENGINECONNS.setting(
        0.55,
        "a suspected disruption: when at least this share of the agents (and at least "
        "`disruption_min_agents`) is silent at once, the RM suspects itself or its network "
        "and declares no agent or EngineConn LOST (operations.md)",
        check=_share,
    )
    disruption_min_agents: int = ENGINECONNS.setting(
        3,
        "fewer agents silent at once than this (at least 2) are never a suspected "
        "disruption: a single dead agent is LOST whatever the size of the fleet",
        check=_at_least_two,
    )
    agent_heartbeat_interval: float = ENGINECONNS.setting(
        3.0, "seconds between agent heartbeats, told to the agents"
    )
    ec_heartbeat_interval: float = ENGINECONNS.setting(
        3.0, "seconds between EngineConn reports, told to the EngineConns"
    )
    kill_grace: float = ENGINECONNS.setting(
        5.0, "seconds between TERM and KILL when an EngineConn is stopped"
    )

    demand_interval: float = DEMANDS.setting(
        1.0, "seconds between planner rounds of one demand (demands.md)"
    )
    demand_lead_time: float = DEMANDS.setting(
        60.0, "seconds before a planned start that capacity is reserved"
    )
    demand_claim_timeout: float = DEMANDS.setting(
        300.0,
        "seconds an ALLOCATED demand may stay unclaimed before it is released and FAILED",
    )
    demand_loose_slip: float = DEMANDS.setting(
        900.0, "seconds a loose demand may slip past its window"
    )
    demand_default_duration: float = DEMANDS.setting(
        3600.0, "seconds a demand is planned to hold without Duration or DeadLine"
    )
    demand_order_by_timeout: float = DEMANDS.setting(
        3600.0,
        "seconds a demand whose window has no end waits for a demand its OrderBy names to be"
        " submitted; past them it FAILS with ORDER_BY_MISSING",
    )
    demand_commit_margin: float = DEMANDS.setting(
        0.25,
        "seconds an allocation may take from its decision to its commit: it is recorded at"
        " the decision plus this (the latest it becomes visible), made only if its window"
        " holds then, and given up if not committing by then (at most half the interval)",
    )

    # Without token_file and TLS, authentication is OFF and every caller is an admin:
    # allowed on loopback only.
    tls_cert: str = TLS.setting(
        "",
        "PEM certificate (chain) of the RM: TLS on every listener; re-read when it changes. "
        "It (or `token_file`) turns authentication on",
    )
    tls_key: str = TLS.setting("", "the private key of `tls_cert` (PEM)")
    tls_client_ca: str = TLS.setting(
        "",
        "CA bundle verifying client certificates (agents, EngineConns; users too when there "
        "is no `agent_listen`)",
    )
    agent_listen: str = TLS.setting(
        "",
        "second address HOST:PORT for agents and EngineConns: TLS with a client certificate "
        "required (empty: none)",
    )
    tls_issuer_cert: str = TLS.setting(
        "", "CA that issues each EngineConn its certificate at launch"
    )
    tls_issuer_key: str = TLS.setting("", "the private key of `tls_issuer_cert`")
    tls_server_ca: str = TLS.setting(
        "", "CA bundle handed to EngineConns to verify the RM (empty: the issuing CA)"
    )
    ec_cert_hours: float = TLS.setting(168.0, "lifetime of an EngineConn certificate in hours")
    token_file: str = TLS.setting(
        "",
        "bearer tokens: SHA-256 hash -> user and roles (`rmctl token add`); re-read when it "
        "changes",
    )
    proxy_users: str = TLS.setting(
        "", "comma-separated users who may act on behalf of others on the user RPCs"
    )
    insecure: bool = TLS.setting(
        False, "allow a non-loopback `listen` without TLS (authentication is still required)"
    )
    allow_host_certificates: bool = TLS.setting(
        False,
        "take client certificates without a labelrm agent identity (host certificates of "
        "the operator's CA) as agents named by their CN or DNS names",
    )
    node_include_required: bool = TLS.setting(
        False,
        "only ECMs the node include list (RefreshNodes) names may register: the list denies "
        "by default, and while it is empty no ECM is allowed",
    )

    apply_rate: float = LIMITS.setting(
        50.0,
        "apply-like calls (Apply, Create/AskEngineConn, SubmitDemand) per second and user "
        "(0: unlimited; admins exempt)",
    )
    apply_burst: int = LIMITS.setting(100, "burst of `apply_rate`")
    call_rate: float = LIMITS.setting(
        200.0, "calls of any user RPC per second and user (0: unlimited)"
    )
    call_burst: int = LIMITS.setting(400, "burst of `call_rate`")
    user_max_message_bytes: int = LIMITS.setting(
        256 * 1024,
        "largest request of a user RPC (agents' RPCs take up to `max_message_bytes`)",
    )
    max_watch_streams: int = LIMITS.setting(
        16, "open health Watch streams per peer address (0: unlimited)"
    )
    max_waiting_applies: int = LIMITS.setting(
        32, "Applies per user waiting for capacity at once (0: unlimited)"
    )
    auth_failure_limit: int = LIMITS.setting(
        10,
        "invalid tokens from one address within `auth_failure_window` after which its "
        "tokens are refused unchecked",
    )
    auth_failure_window: float = LIMITS.setting(60.0, "seconds of `auth_failure_limit`")


RM_SERVER: Program[Settings] = Program(
    prog="rm-server",
    settings=Settings,
    description="labelrm resource manager (docs/configuration.md).",
    version=VERSION,
    env_prefix="LABELRM_",
    config_env="LABELRM_CONFIG",
    switches=(
        ("--dev", "also start one local agent (dev mode: embedded database, loopback only)"),
        ("--dev-tls", "with --dev: TLS, certificates and an admin token, from a throwaway CA"),
        (
            "--reset",
            "start afresh: delete the embedded database of the data directory (wherever "
            "its files are) before starting",
        ),
    ),
)

LoadedConfig = Loaded[Settings]


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> LoadedConfig:
    """The effective settings with their sources and the switches (`dev`, `dev_tls`); a
    bad setting is one line on stderr and SystemExit(2)."""
    return load_or_exit(RM_SERVER, argv, environ)
