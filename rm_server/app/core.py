"""The RM's use cases, between the gRPC servicers and the store: RMCore, the one object
the service layer talks to, composed of one part per kind of work.

- `tickets` (app/tickets.py): Apply (at once or waiting), ReportUsed, Release, reads;
- `capacity` (app/capacity.py): ECM registrations, label limits, the label records;
- `consistency` (app/consistency.py): the consistency check;
- `cluster` (app/cluster.py): the cluster figures (replicas, waiting applies, events);
- `listings` (app/listings.py): bounded lists and aggregates for the web console;
- `sweeps` and `replicas` (app/sweeps.py): lock expiry, retention, replica liveness;
- `usage` (app/usage.py): the usage ledger's roll-up and reports.

No gRPC and no SQL here: requests arrive as domain values, the store runs each
operation in one transaction, and results leave as domain values (or as the
stored outcome of an earlier call with the same request id).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rm_server.app.background import Lease, PassObserver
from rm_server.app.capacity import Capacity
from rm_server.app.cluster import Cluster
from rm_server.app.consistency import Consistency
from rm_server.app.listings import Listings
from rm_server.app.providers import ExternalResources
from rm_server.app.shared import CoreSettings
from rm_server.app.sweeps import Replicas, Sweeps
from rm_server.app.tickets import Tickets
from rm_server.app.usage import Usage
from rm_server.clock import Clock, IdFactory, SystemClock, random_ids
from rm_server.domain.usage import Ledger
from rm_server.store.db import Database
from rm_server.store.notify import LabelNotifier

__all__ = ["CoreSettings", "RMCore"]


@dataclass
class RMCore:
    """The shared context of the parts (the database, the notifier, the settings, the
    clock, ids, the external resources) and the parts themselves. The parts read the
    context through this object when they use it (app/shared.py)."""

    db: Database
    notifier: LabelNotifier
    settings: CoreSettings = field(default_factory=CoreSettings)
    clock: Clock = field(default_factory=SystemClock)
    new_id: IdFactory = random_ids
    # External resources (YARN queues); None: requests are admitted on labelrm's records only.
    external: ExternalResources | None = None
    # Told how many LOCKED tickets each sweep reclaimed (when any): the metrics' counter.
    on_reclaimed: Callable[[int], object] | None = None
    # Told what each roll-up into the usage ledger added: the metrics' counters.
    on_rolled: Callable[[Ledger], object] | None = None
    tickets: Tickets = field(init=False)
    capacity: Capacity = field(init=False)
    consistency: Consistency = field(init=False)
    cluster: Cluster = field(init=False)
    listings: Listings = field(init=False)
    replicas: Replicas = field(init=False)
    sweeps: Sweeps = field(init=False)
    usage: Usage = field(init=False)

    def __post_init__(self) -> None:
        self.tickets = Tickets(self)
        self.capacity = Capacity(self)
        self.consistency = Consistency(self)
        self.cluster = Cluster(self)
        self.listings = Listings(self)
        self.replicas = Replicas(self)
        self.usage = Usage(self, self.on_rolled)
        self.sweeps = Sweeps(self, self.replicas, self.usage, self.on_reclaimed)

    @property
    def replica_id(self) -> str:
        """This replica's id once it joined (`replicas.join`); "" before."""
        return self.replicas.replica_id

    def start_background(
        self,
        lease: Lease | None = None,
        observe: PassObserver | None = None,
        *,
        ticket_sweep: bool = True,
    ) -> None:
        """Start the sweeps and the usage roll-up (the ticket sweep and the roll-up only
        while this replica holds `lease`, each of their passes told to `observe`; neither
        without `ticket_sweep`: a process that serves agents only leaves them to the
        users' one)."""
        self.sweeps.start(lease, observe, ticket_sweep=ticket_sweep)
        if ticket_sweep:
            self.usage.start(lease, observe)

    async def stop_background(self, grace: float | None = None) -> None:
        """Finish the grouped requests (cancelled past `grace` seconds), stop the sweeps
        and leave the replicas."""
        await self.tickets.close(grace)
        await self.sweeps.stop()
        await self.usage.stop()
        await self.replicas.leave()
