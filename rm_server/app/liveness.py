"""Liveness: whether the RM could hear, and the judge's verdict on silent agents and
EngineConns (the rules are pure, in rm_server/domain/liveness.py; AgentHub.sweep carries
the verdicts out).

Every replica checks every `sweep_interval` that it hears (`Hearing.check`: its event
loop ran and its database answered); the judge, on the replica holding the liveness
lease, checks again at the start of each pass. The first check that succeeds after a
longer gap (a stall, a pause, the database away) moves the heard-since mark shared in
the database to its own time, as does a start and the judge taking over. Beats may reach
any replica, and any replica's deafness costs the agents it serves their beats: the
mark is the fleet's, and every replica's moves it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from rm_server.clock import Clock
from rm_server.domain.liveness import (
    Cutoffs,
    Episode,
    LivenessRecord,
    LivenessRules,
    LivenessView,
    cutoffs,
    is_disruption,
    judged_from,
    next_disruption,
    stalled,
)
from rm_server.store import ecms as ecm_store
from rm_server.store import liveness as liveness_store
from rm_server.store.db import Database

log = logging.getLogger(__name__)


# Seconds between the event loop's own ticks (`Hearing._tick`): how late one comes is how
# long the loop, or the whole process, did not run.
LOOP_TICK = 0.25


class Hearing:
    """This replica's side of the heard-since mark (one per replica)."""

    def __init__(self, db: Database, clock: Clock, rules: LivenessRules) -> None:
        self.db = db
        self.clock = clock
        self.rules = rules
        self._last = clock.monotonic()  # the end of the last successful check
        self._lock = asyncio.Lock()  # the periodic check and the judge's, one at a time
        self._ticked = clock.monotonic()
        self._loop_gap = 0.0  # the longest gap between two ticks since the last check
        self._ticks: asyncio.TimerHandle | None = None

    async def start(self, replica_id: str) -> LivenessRecord:
        """At start-up, before the judge's first pass: the RM heard nothing while it was
        not running (a restart after a crash may come long after the last beats)."""
        async with self._lock:
            record = await self.mark(f"rm-server started (replica {replica_id})", started=True)
            self._last = self._ticked = self.clock.monotonic()
            self._tick()
            return record

    def close(self) -> None:
        """Stop the loop's ticks (at shutdown)."""
        if self._ticks is not None:
            self._ticks.cancel()
            self._ticks = None

    def _tick(self) -> None:
        """Run by the event loop every LOOP_TICK seconds: tells a stopped or blocked loop
        (a long gap) from a database that did not answer (ticks on time)."""
        now = self.clock.monotonic()
        self._loop_gap = max(self._loop_gap, now - self._ticked)
        self._ticked = now
        self._ticks = asyncio.get_running_loop().call_later(LOOP_TICK, self._tick)

    async def check(self) -> LivenessRecord:
        """Prove that this replica hears (its loop runs, its database answers) and return
        the shared state. When the last successful check is longer ago than the rules
        allow, the mark moves to now. A failed check raises (the database's error), and
        the next one to succeed ends the gap."""
        async with self._lock:
            loop_gap = self.clock.monotonic() - self._ticked  # a tick not yet run counts
            record = await self.db.run(liveness_store.read)
            done = self.clock.monotonic()
            if stalled(self._last, done, self.rules):
                gap = done - self._last
                if max(self._loop_gap, loop_gap) >= gap / 2:
                    record = await self.mark(f"rm-server was stalled for {gap:.1f} s")
                else:
                    record = await self.mark(
                        f"rm-server could not reach its database for {gap:.1f} s"
                    )
            elif record is None:  # the row is made at start-up: a database restored since
                record = await self.mark("the liveness state was missing")
            self._last, self._loop_gap = done, 0.0
            return record

    async def mark(self, why: str, *, started: bool = False) -> LivenessRecord:
        """Move the shared mark to now, `why`, with one warning line (a start: info)."""
        at = self.clock.now()
        record = await self.db.run(lambda c: liveness_store.hear_since(c, at, why, started=started))
        agents, engine_conns = judged_from(record.heard_since, self.rules)
        log.log(
            logging.INFO if started else logging.WARNING,
            "liveness: %s: every agent and EngineConn gets a fresh grace window (agents are"
            " judged silent from %s on, EngineConns from %s on)",
            why,
            agents.isoformat(timespec="seconds"),
            engine_conns.isoformat(timespec="seconds"),
        )
        return record


@dataclass(frozen=True)
class Verdict:
    """What one pass of the judge decided: the agents to declare LOST (silent since
    before `agents_silent_before`), and the EngineConn cutoffs if EngineConns are judged
    this pass (None: within their grace window, or during a suspected disruption)."""

    now: datetime
    lose: tuple[str, ...]
    agents_silent_before: datetime | None
    engine_conns: tuple[datetime, datetime] | None  # (silent before, STARTING before)


class LivenessJudge:
    """The judge's pass (on the replica holding the liveness lease): hearing, grace
    windows, the suspected-disruption guard."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        rules: LivenessRules,
        replica: Callable[[], str],
        include_required: bool = False,
    ) -> None:
        self.db = db
        self.clock = clock
        self.rules = rules
        self.replica = replica  # this replica's id, once it joined
        self.include_required = include_required
        self.hearing = Hearing(db, clock, rules)

    async def verdict(self) -> Verdict:
        """One pass: check hearing, then weigh the agents silent past the expiry."""
        record = await self.hearing.check()
        me = self.replica()
        if record.judge and record.judge != me:
            # The agents the last judge's replica served lost it: they need time to
            # come back through another (Nomad resets every TTL after an election).
            record = await self.hearing.mark(
                f"this replica took over the liveness judge from {record.judge}"
            )
        now = self.clock.now()
        cut = cutoffs(now, record.heard_since, self.rules)
        lose: tuple[str, ...] = ()
        disrupted_since = record.disrupted_since
        counted: tuple[int, int] | None = None
        if cut.agents is not None and cut.suspect is not None:
            past, suspect = cut.agents, cut.suspect
            silent = await self.db.run(lambda c: ecm_store.expired_ecms(c, past))
            if silent:
                counted = await self.db.run(lambda c: ecm_store.count_silent(c, suspect))
            disrupted = counted is not None and is_disruption(counted[1], counted[0], self.rules)
            disrupted_since, episode = next_disruption(disrupted_since, disrupted, now)
            lose = await self._condemned(silent, disrupted)
            if episode is not Episode.UNCHANGED:
                cut = await self._episode(episode, record, counted, now) or cut
        await self.db.run(
            lambda c: liveness_store.record_pass(c, me, now, disrupted_since, counted)
        )
        engine_conns = None
        if cut.engine_conns is not None and cut.starts is not None and disrupted_since is None:
            engine_conns = (cut.engine_conns, cut.starts)
        return Verdict(now, lose if cut.agents is not None else (), cut.agents, engine_conns)

    async def _condemned(self, silent: list[str], disrupted: bool) -> tuple[str, ...]:
        """Of the agents silent past the expiry, those to declare LOST: all of them, or
        during a suspected disruption only those the node lists exclude (an operator's
        word that they are gone)."""
        if not disrupted:
            return tuple(silent)
        lists = await self.db.run(ecm_store.node_lists)
        return tuple(i for i in silent if not lists.allows(i, self.include_required))

    async def _episode(
        self,
        episode: Episode,
        record: LivenessRecord,
        counted: tuple[int, int] | None,
        now: datetime,
    ) -> Cutoffs | None:
        """Say so when a suspected disruption begins or ends (one line each); when it
        ends, every agent and EngineConn gets a fresh grace window (the cutoffs then)."""
        if episode is Episode.BEGAN:
            silent, agents = counted or (0, 0)
            log.warning(
                "liveness: suspected disruption began: %d of %d agents silent at once;"
                " suspecting the RM or its network, not the agents: no agent or EngineConn"
                " is declared LOST until fewer are silent (operations.md)",
                silent,
                agents,
            )
            return None
        began = record.disrupted_since
        lasted = (now - began).total_seconds() if began is not None else 0.0
        marked = await self.hearing.mark(f"a suspected disruption ended after {lasted:.1f} s")
        return cutoffs(now, marked.heard_since, self.rules)

    async def view(self) -> LivenessView:
        """The judge's state for operators (GetClusterInfo, metrics)."""
        record = await self.db.run(liveness_store.read, read_only=True)
        if record is None:  # no replica started on this database yet
            record = LivenessRecord(self.clock.now(), "")
        return LivenessView.of(record, self.rules)
