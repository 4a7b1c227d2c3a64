"""The HTTP endpoint that serves an RM process's Prometheus metrics
(rm_server/observability/metrics.py): GET /metrics on the RM's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST

from rm_server.observability.metrics import Metrics

log = logging.getLogger(__name__)


def split_host_port(address: str) -> tuple[str, int]:
    """ "HOST:PORT" or "[V6]:PORT" -> (host, port); ValueError when malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _header(lines: list[str], name: str) -> str | None:
    """The value of header `name` among a request head's lines (None when absent)."""
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None


class MetricsHttpServer:
    """A minimal asyncio HTTP/1.1 endpoint: GET /metrics (and / pointing at it).

    Served on the RM's event loop rather than prometheus_client's thread, so the label
    collector can await the database between two scrapes without cross-thread calls.
    `tls`: served over HTTPS; `authorize`: given the Authorization header (None when
    absent), whether to serve the scrape (401 otherwise). The security set-up decides
    both (`security.setup.Security.metrics_guard`).
    """

    MAX_HEADER_BYTES = 16 * 1024
    READ_TIMEOUT = 10.0

    def __init__(
        self,
        metrics: Metrics,
        address: str,
        *,
        tls: ssl.SSLContext | None = None,
        authorize: Callable[[str | None], bool] | None = None,
    ) -> None:
        self.metrics = metrics
        self.address = address
        self.tls = tls
        self.authorize = authorize
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        host, port = split_host_port(self.address)
        self._server = await asyncio.start_server(self._handle, host, port, ssl=self.tls)
        self.port = int(self._server.sockets[0].getsockname()[1])
        scheme = "https" if self.tls is not None else "http"
        guarded = " (admin token required)" if self.authorize is not None else ""
        log.info("metrics on %s://%s:%d/metrics%s", scheme, host, self.port, guarded)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=self.READ_TIMEOUT)
            if len(head) > self.MAX_HEADER_BYTES:
                raise ValueError("request head too large")
            lines = head.decode("latin-1").split("\r\n")
            method, _, rest = lines[0].partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            extra = ""
            if self.authorize is not None and not self.authorize(_header(lines, "authorization")):
                status, ctype, body = "401 Unauthorized", "text/plain", b"admin token required\n"
                extra = 'WWW-Authenticate: Bearer realm="labelrm"\r\n'
            else:
                status, ctype, body = await self._respond(method, path)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (
            TimeoutError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            ssl.SSLError,
        ):
            pass  # a broken or slow client: just close the connection
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"only GET\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, await self.metrics.exposition()
        if path == "/":
            return "200 OK", "text/html", b'<a href="/metrics">labelrm metrics</a>\n'
        return "404 Not Found", "text/plain", b"not found: try /metrics\n"
