"""The consistency check: every label record against the live tickets charged to it."""

from __future__ import annotations

from rm_server.app.shared import Shared
from rm_server.domain.model import ConsistencyReport
from rm_server.store import admin as admin_store


class Consistency:
    """CheckConsistency (and the console's view of it)."""

    def __init__(self, core: Shared) -> None:
        self.core = core

    async def check(self) -> ConsistencyReport:
        """Recompute each record's used and locked resource from the live tickets and
        report the records that disagree, and those over their maximum (read-only:
        nothing is repaired)."""
        db = self.core.db
        return await db.run(admin_store.check_consistency, read_only=True, bound=db.slow_timeout)
