"""Group concurrent requests into shared transactions: Apply / ReportUsed / Release
(rm_server/store/tickets.py) and agent heartbeats (rm_server/store/heartbeats.py).

Requests queue in arrival order. When fewer than `max_inflight` groups are running,
everything queued (up to `max_batch`) leaves as one group at once: a request that
arrives alone runs alone, without waiting for company; under load, the requests
that arrive while a group runs form the next one. So the hot label row is locked,
written and committed once per group instead of once per request, and the commit
(the WAL flush) is shared.

With a `linger`, a group leaves at most that long after its oldest request arrived (or
at once when full), so that fewer, bigger groups serve the same load: heartbeats use it,
as a few milliseconds on a beat every few seconds cost nothing. Requests that already
waited that long behind a running group leave as soon as it is done.

Two requests with the same key never share a group: the second of two with the same
request id replays the first's stored outcome in a later group, and two heartbeats of
one agent run one after the other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from rm_server.errors import Unavailable

log = logging.getLogger(__name__)


# A request's identity in a group: (caller, method, request id).
Key = tuple[str, str, str]


class Keyed(Protocol):
    """A request a combiner can group: requests with the same key never share a group."""

    @property
    def key(self) -> Key: ...


OpT = TypeVar("OpT", bound=Keyed)
# Runs one group; answers one outcome per op, in order (an exception is an outcome).
RunGroup = Callable[[Sequence[OpT]], Awaitable[list[Any]]]


class Combiner(Generic[OpT]):
    """Groups requests submitted concurrently; see the module docstring."""

    def __init__(
        self,
        run: RunGroup[OpT],
        *,
        max_batch: int = 256,
        max_inflight: int = 1,
        linger: float = 0.0,
    ) -> None:
        self.run = run
        self.max_batch = max(1, max_batch)
        self.max_inflight = max(1, max_inflight)
        self.linger = max(0.0, linger)
        self._linger_timer: asyncio.TimerHandle | None = None
        # (op, its caller's future, when it arrived on the loop's clock)
        self._queue: deque[tuple[OpT, asyncio.Future[Any], float]] = deque()
        self._inflight = 0
        self._busy_keys: set[Key] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # For tests and the benchmarks' curiosity: groups run, requests in them, and the
        # seconds spent running groups (summed over groups in flight at once).
        self.groups = 0
        self.requests = 0
        self.seconds = 0.0

    @property
    def queued(self) -> int:
        """Requests submitted that no group has taken yet."""
        return len(self._queue)

    async def submit(self, op: OpT) -> Any:
        """Run `op` in the next group; its result, or its exception raised here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((op, future, loop.time()))
        self._kick()
        return await future

    def _kick(self) -> None:
        if self.linger and self._queue and len(self._queue) < self.max_batch:
            # Let company gather until the oldest request has waited `linger` seconds
            # (less CPU per request, for requests that can afford the wait), unless a
            # full group is already there.
            loop = asyncio.get_running_loop()
            leave_at = self._queue[0][2] + self.linger
            if loop.time() < leave_at:
                if self._linger_timer is None and self._inflight < self.max_inflight:
                    self._linger_timer = loop.call_at(leave_at, self._linger_over)
                return
        self._start_groups()

    def _linger_over(self) -> None:
        # The request it was set for may have left since: _kick looks at the oldest now.
        self._linger_timer = None
        self._kick()

    def _start_groups(self) -> None:
        while self._queue and self._inflight < self.max_inflight:
            group: list[tuple[OpT, asyncio.Future[Any], float]] = []
            later: list[tuple[OpT, asyncio.Future[Any], float]] = []
            keys: set[Key] = set()
            while self._queue and len(group) < self.max_batch:
                item = self._queue.popleft()
                if item[1].done():  # its caller went away before it started: drop it
                    continue
                key = item[0].key
                if key in keys or key in self._busy_keys:
                    later.append(item)
                    continue
                keys.add(key)
                group.append(item)
            self._queue.extendleft(reversed(later))
            if not group:
                return
            self._inflight += 1
            self._busy_keys |= keys
            task = asyncio.create_task(self._run(group, keys), name="rm-request-group")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(
        self, group: list[tuple[OpT, asyncio.Future[Any], float]], keys: set[Key]
    ) -> None:
        outcomes: list[Any]
        started = time.monotonic()
        try:
            outcomes = await self.run([op for op, _, _ in group])
        except asyncio.CancelledError:
            outcomes = [None] * len(group)
            for _, future, _ in group:
                future.cancel()
            raise
        except BaseException as exc:  # run() answers per op; this is a last resort
            log.exception("request group failed")
            outcomes = [exc] * len(group)
        finally:
            self._inflight -= 1
            self._busy_keys -= keys
            self.groups += 1
            self.requests += len(group)
            self.seconds += time.monotonic() - started
            self._kick()
        for (_, future, _), outcome in zip(group, outcomes, strict=True):
            if future.done():  # the caller went away (cancelled RPC): the outcome is logged
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def close(self, grace: float | None = None) -> None:
        """Wait for the groups in flight (new requests are the caller's to stop); those
        still running after `grace` seconds are cancelled (their transactions roll
        back; their callers, gone with the server, retry with their request ids). A
        statement waiting on a lock another session holds would otherwise keep the
        process from stopping for as long as that session likes."""
        if not self._tasks:
            return
        _, running = await asyncio.wait(list(self._tasks), timeout=grace)
        if running:
            log.warning(
                "%d request groups still running %.1f s into the shutdown: cancelled",
                len(running),
                grace,
            )
            for task in running:
                task.cancel()
            await asyncio.wait(running, timeout=grace)


async def each_alone_on_failure(run: RunGroup[OpT], ops: Sequence[OpT], what: str) -> list[Any]:
    """`run(ops)`; should the group fail as a whole for a reason other than the database
    being away, each op runs alone, so that the failure stays with the op that caused it
    (`what` names the ops in the log line)."""
    try:
        return await run(ops)
    except Unavailable as exc:
        return [exc] * len(ops)
    except Exception as exc:
        if len(ops) == 1:
            return [exc]
        log.warning("a group of %d %s failed (%r): running them one by one", len(ops), what, exc)
        return [(await each_alone_on_failure(run, [op], what))[0] for op in ops]
