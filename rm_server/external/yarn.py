"""The YARN requester: live queue figures from a YARN ResourceManager's REST API.

One requester per provider. It reads ``GET /ws/v1/cluster/scheduler`` (and, for the capacity
scheduler, ``GET /ws/v1/cluster/metrics`` for the cluster totals) from the active RM of the
provider's address list, and keeps the parsed snapshot for ``cache_ttl_seconds``: every apply
and query inside that window shares one snapshot, and concurrent callers at its end share one
fetch (singleflight), so the RM sees at most one scheduler request per TTL however many
applies arrive.

Active-RM discovery follows Hadoop's ResourceManager HA documentation: a standby RM answers
web service requests with a redirect to the active one (307, or 200 with the text "This is
standby RM" on older releases) and answers ``/ws/v1/cluster/info`` itself with
``haState: STANDBY``. The requester never follows the redirect (it would send the provider's
credentials to whatever the Location names); it asks each configured address for
``/ws/v1/cluster/info`` and uses the one that says ACTIVE, re-discovering whenever the RM it
used stops answering or turns standby. Transport failures are retried a bounded number of
times (tenacity) before the apply fails UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_fixed

from rm_server.clock import Clock
from rm_server.domain.external import (
    AuthKind,
    MalformedResponse,
    ProviderConfig,
    SchedulerKind,
    SchedulerSnapshot,
    ha_state,
    parse_scheduler,
)
from rm_server.external.secrets import SecretMissing, SecretSource

log = logging.getLogger(__name__)
# httpx logs every request at INFO ("HTTP Request: GET ..."): one line per fetch and URL in
# the RM's log. The requester logs what matters (the active RM changing); the rest is noise.
logging.getLogger("httpx").setLevel(logging.WARNING)

SCHEDULER = "/ws/v1/cluster/scheduler"
METRICS = "/ws/v1/cluster/metrics"
INFO = "/ws/v1/cluster/info"
STANDBY_TEXT = "This is standby RM"
ATTEMPTS = 3  # rounds over the address list before giving up
RETRY_WAIT = 0.2


class RMUnreachable(Exception):
    """No active ResourceManager answered (all down, all standby, or errors)."""


class RMAuthRejected(Exception):
    """The RM refused the provider's credentials (HTTP 401/403)."""


class _Standby(Exception):
    pass


class YarnRequester:
    """Fetches and caches one provider's scheduler snapshot. A password named by the
    provider's `password_secret` is read from `secrets` at every fetch (rotation needs
    no restart; rm_server/external/secrets.py)."""

    def __init__(
        self, config: ProviderConfig, clock: Clock, secrets: SecretSource | None = None
    ) -> None:
        self.config = config
        self.clock = clock
        self._secrets = secrets if secrets is not None else SecretSource()
        self._auth: httpx.Auth | None = None  # this fetch's credentials
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_seconds),
            follow_redirects=False,
            headers={"Accept": "application/json"},
        )
        self._active: str | None = None
        self._cached: SchedulerSnapshot | None = None  # the last successful fetch
        self._cached_until = 0.0
        self._inflight: asyncio.Future[SchedulerSnapshot] | None = None
        self._task: asyncio.Task[None] | None = None
        self.fetches = 0  # scheduler documents fetched (tests and metrics)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        await self._client.aclose()

    @property
    def last_good(self) -> SchedulerSnapshot | None:
        """The last snapshot fetched successfully (however old)."""
        return self._cached

    async def snapshot(self, *, fresh: bool = False) -> SchedulerSnapshot:
        """The cached snapshot while it is younger than the TTL, else one shared fetch."""
        if not fresh and self._cached is not None and time.monotonic() < self._cached_until:
            return self._cached
        if self._inflight is None:
            self._inflight = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._refresh(self._inflight))
        return await asyncio.shield(self._inflight)

    async def _refresh(self, future: asyncio.Future[SchedulerSnapshot]) -> None:
        try:
            snap = await self._fetch_with_retries()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            # The one line of a failed fetch, with what only the operator may see (users
            # are told the cluster only: rm_server/external/__init__.py).
            log.warning(
                "yarn provider %s (cluster=%s): fetch failed: %s",
                self.config.name, self.config.cluster, exc,
            )  # fmt: skip
            future.set_exception(exc)
            # Nobody may be waiting any more: mark the exception retrieved.
            future.exception()
        else:
            self._cached = snap
            self._cached_until = time.monotonic() + self.config.cache_ttl_seconds
            future.set_result(snap)
        finally:
            self._inflight = None

    def _credentials(self) -> httpx.Auth | None:
        """The provider's basic auth: its stored password, or the one its secret holds
        now (RMAuthRejected when that secret is not there)."""
        config = self.config
        if config.auth is not AuthKind.BASIC:
            return None
        password = config.password
        if config.password_secret:
            try:
                password = self._secrets.read(config.password_secret)
            except SecretMissing as exc:
                raise RMAuthRejected(f"no password: {exc}") from None
        return httpx.BasicAuth(config.username, password)

    async def _fetch_with_retries(self) -> SchedulerSnapshot:
        """At most ATTEMPTS rounds, and never longer than ATTEMPTS request timeouts in all
        (an address list of hosts that do not answer must not hold applies for minutes)."""
        self._auth = self._credentials()
        budget = self.config.timeout_seconds * ATTEMPTS
        try:
            async with asyncio.timeout(budget):
                return await self._retrying()
        except TimeoutError:
            raise RMUnreachable(f"no answer within {budget:g}s") from None

    async def _retrying(self) -> SchedulerSnapshot:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(ATTEMPTS),
            wait=wait_fixed(RETRY_WAIT),
            retry=retry_if_exception_type(RMUnreachable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._fetch_once()
        raise AssertionError("unreachable")  # reraise=True: the last error propagates

    async def _fetch_once(self) -> SchedulerSnapshot:
        address = self._active or await self.discover()
        try:
            doc = await self._get_json(address, SCHEDULER)
            metrics = None
            if _scheduler_type(doc) == "capacityScheduler":
                metrics = await self._get_json(address, METRICS)
        except (_Standby, RMUnreachable) as exc:
            # The failed fetch gets its one line (_refresh); this is detail.
            log.debug(
                "yarn provider %s: RM %s unusable (%s), re-discovering",
                self.config.name,
                address,
                exc,
            )
            self._active = None
            raise RMUnreachable(f"RM {address}: {exc}") from None
        self.fetches += 1
        snap = parse_scheduler(doc, metrics, capacity_guaranteed=self.config.capacity_guaranteed)
        return replace(snap, fetched_at=self.clock.now(), active_address=address)

    async def discover(self) -> str:
        """The address whose ``/ws/v1/cluster/info`` says ACTIVE (or has no HA state)."""
        problems: list[str] = []
        for address in self.config.addresses:
            try:
                state = ha_state(await self._get_json(address, INFO))
            except (RMUnreachable, _Standby, MalformedResponse) as exc:
                problems.append(f"{address}: {exc}")
                continue
            if state in ("", "ACTIVE"):
                if self._active != address:
                    log.info("yarn provider %s: active RM is %s", self.config.name, address)
                self._active = address
                return address
            problems.append(f"{address}: {state}")
        raise RMUnreachable("no active ResourceManager (" + "; ".join(problems) + ")")

    async def _get_json(self, address: str, path: str) -> Any:
        try:
            resp = await self._client.get(address + path, auth=self._auth)
        except httpx.HTTPError as exc:
            raise RMUnreachable(f"{type(exc).__name__}: {exc}") from None
        if resp.status_code in (401, 403):
            raise RMAuthRejected(f"RM {address} refused the credentials (HTTP {resp.status_code})")
        if resp.is_redirect or STANDBY_TEXT in resp.text[:200]:
            raise _Standby("standby RM")
        if resp.status_code != 200:
            raise RMUnreachable(f"HTTP {resp.status_code} on {path}")
        try:
            return json.loads(resp.content)
        except ValueError as exc:
            raise MalformedResponse(f"RM {address} {path}: not JSON ({exc})") from None


def _scheduler_type(doc: Any) -> object:
    try:
        return doc["scheduler"]["schedulerInfo"]["type"]
    except (KeyError, TypeError):
        return None


__all__ = ["RMAuthRejected", "RMUnreachable", "SchedulerKind", "YarnRequester"]
