"""Capacity: the ECMs' registrations and the label limits, which bound the label records,
and the reads of those records (what each label uses, locks and has left)."""

from __future__ import annotations

from rm_server.app.shared import Shared
from rm_server.domain.engineconn import Isolation
from rm_server.domain.labels import EM_INSTANCE, Label
from rm_server.domain.limits import LabelPattern
from rm_server.domain.model import LabelResource, Registration, StoredLimit
from rm_server.domain.resources import Resource
from rm_server.errors import InvalidArgument
from rm_server.store import admin as admin_store
from rm_server.store.db import Idempotency, OutcomeEncoder, Replay


class Capacity:
    """RegisterEcm / UnregisterEcm, the label limits, and the label records."""

    def __init__(self, core: Shared) -> None:
        self.core = core

    async def register_ecm(
        self,
        idem: Idempotency,
        instance: str,
        labels: tuple[Label, ...],
        total: Resource,
        protected: Resource,
        encoder: OutcomeEncoder[Registration],
        isolation: Isolation | None = None,
    ) -> Registration | Replay:
        """Register (or re-register) ECM `instance` with its capacity: its record is
        ``emInstance=<instance>``, whatever else `labels` names; `isolation`: how its
        agent contains EngineConns (None: it did not say)."""
        own = Label(EM_INSTANCE, instance)
        others = tuple(lb for lb in labels if lb.key != EM_INSTANCE)
        if any(lb.key == EM_INSTANCE and lb != own for lb in labels):
            raise InvalidArgument("labels", f"emInstance must equal the instance {instance!r}")
        if not total.ge(protected):
            raise InvalidArgument("protected_resource", "must not exceed total_resource")
        all_labels = (own, *others)
        now = self.core.clock.now()
        include_required = self.core.settings.node_include_required
        return await self.core.db.run_idempotent(
            idem,
            now,
            lambda c: admin_store.register_ecm(
                c,
                instance,
                str(own),
                all_labels,
                total,
                protected,
                now,
                include_required,
                isolation,
            ),
            encoder,
        )

    async def unregister_ecm(
        self, idem: Idempotency, instance: str, encoder: OutcomeEncoder[list[str]]
    ) -> list[str] | Replay:
        """Unregister ECM `instance`: its live tickets are released (their ids returned),
        its EngineConns end LOST."""
        now = self.core.clock.now()
        return await self.core.db.run_idempotent(
            idem, now, lambda c: admin_store.unregister_ecm(c, instance, now), encoder
        )

    async def set_limit(
        self,
        idem: Idempotency,
        pattern: LabelPattern,
        max_resource: Resource,
        encoder: OutcomeEncoder[tuple[StoredLimit, int]],
    ) -> tuple[StoredLimit, int] | Replay:
        """Set the limit of `pattern`; the stored limit and how many records it bounds."""
        now = self.core.clock.now()
        return await self.core.db.run_idempotent(
            idem, now, lambda c: admin_store.set_limit(c, pattern, max_resource, now), encoder
        )

    async def delete_limit(
        self, idem: Idempotency, pattern: LabelPattern, encoder: OutcomeEncoder[int]
    ) -> int | Replay:
        """Delete the limit of `pattern`; how many records it bounded."""
        now = self.core.clock.now()
        return await self.core.db.run_idempotent(
            idem, now, lambda c: admin_store.delete_limit(c, pattern, now), encoder
        )

    async def list_limits(self, after: str, limit: int) -> list[StoredLimit]:
        """A page of the stored limits, after pattern `after`."""
        return await self.core.db.run(lambda c: admin_store.list_limits(c, after, limit))

    async def get_label_resource(self, label: str) -> LabelResource:
        """The record of one label (NotFound when there is none)."""
        return await self.core.db.run(lambda c: admin_store.get_label_resource(c, label))

    async def list_label_resources(
        self, after: str, limit: int, source: str
    ) -> list[LabelResource]:
        """A page of label records after label `after` (`source` "" for every source)."""
        return await self.core.db.run(
            lambda c: admin_store.list_label_resources(c, after, limit, source)
        )
