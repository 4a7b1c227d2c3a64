"""What the parts of the core share: their settings and the context RMCore holds for them.

The parts (app/tickets.py, app/capacity.py, app/consistency.py, app/cluster.py,
app/sweeps.py) each take the core as a `Shared`: they read the database, the clock and the
settings through it at the time of use, so a test that replaces `core.settings` is seen by
every part at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from rm_server.app.providers import ExternalResources
from rm_server.clock import Clock, IdFactory
from rm_server.domain.labels import DEFAULT_RULES, TransformRule
from rm_server.store.db import Database
from rm_server.store.notify import LabelNotifier


@dataclass(frozen=True)
class CoreSettings:
    """The core's tunables (rm_server/server.py builds them from the server's settings)."""

    lock_timeout: timedelta = timedelta(minutes=10)
    request_id_retention: timedelta = timedelta(hours=48)
    # Ended tickets (ticket_history), EngineConns and demands are kept this long, then
    # deleted by the sweep (checked every `retention_interval` seconds).
    history_retention: timedelta = timedelta(days=30)
    retention_interval: float = 60.0
    # The usage ledger's roll-up (app/usage.py): every `usage_interval` seconds, at most
    # `usage_batch` rows of each source per transaction.
    usage_interval: float = 10.0
    usage_batch: int = 1000
    sweep_interval: float = 1.0
    rules: tuple[TransformRule, ...] = DEFAULT_RULES
    expiry_batch: int = 200
    # Concurrent Apply / ReportUsed / Release share transactions (rm_server/app/batching.py):
    # at most `batch_max` requests per transaction (0: one transaction per request, the
    # classic path), at most `batch_inflight` such transactions at a time per process.
    batch_max: int = 256
    batch_inflight: int = 1
    # Only ECMs the node include list names may register (none while it is empty).
    node_include_required: bool = False
    # Agent heartbeats (rm_server/app/agents.py) are grouped the same way, each group leaving
    # at most `heartbeat_linger` seconds after its first beat.
    heartbeat_linger: float = 0.005
    # A waiting Apply holds capacity back from later requests for at most this long
    # (docs/architecture.md, "Waiting applies and fairness").
    waiter_hold: timedelta = timedelta(seconds=30)


class Shared(Protocol):
    """The context every part of the core reads (RMCore provides it); read-only here:
    the parts never change it."""

    @property
    def db(self) -> Database: ...

    @property
    def notifier(self) -> LabelNotifier: ...

    @property
    def settings(self) -> CoreSettings: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def new_id(self) -> IdFactory: ...

    @property
    def external(self) -> ExternalResources | None:
        """External resources (YARN queues); None: requests are admitted on labelrm's
        records only."""
        ...

    @property
    def replica_id(self) -> str:
        """This replica's id once it joined (app/sweeps.py, `Replicas`); "" before."""
        ...
