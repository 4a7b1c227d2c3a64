"""Channels to the RM: plaintext, TLS, TLS with a client certificate, and a bearer
token on every call (sync and grpc.aio). Used by the SDK, rmctl and the ECM agent.

The token rides in call metadata (``authorization: Bearer …``) added by a client
interceptor rather than as gRPC call credentials: those are refused on plaintext
channels, and dev set-ups on loopback may use tokens without TLS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

Options = Sequence[tuple[str, Any]]


@dataclass(frozen=True)
class ChannelSecurity:
    """How to reach the RM: `tls_ca` (PEM file) turns TLS on; `tls_cert` + `tls_key`
    add a client certificate; `token` is sent as a bearer token on every call."""

    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    token: str = ""

    def credentials(self) -> grpc.ChannelCredentials | None:
        """The TLS credentials, or None for plaintext."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("a client certificate needs both tls_cert and tls_key")
        if not self.tls_ca and not self.tls_cert:
            return None
        # Without tls_ca the system's trust store verifies the RM.
        root = Path(self.tls_ca).read_bytes() if self.tls_ca else None
        if self.tls_cert:
            return grpc.ssl_channel_credentials(
                root, Path(self.tls_key).read_bytes(), Path(self.tls_cert).read_bytes()
            )
        return grpc.ssl_channel_credentials(root)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def _with_metadata(details: Any, extra: tuple[tuple[str, str], ...]) -> Any:
    metadata = list(details.metadata or ()) + list(extra)
    return details._replace(metadata=metadata)


class _SyncToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, extra: tuple[tuple[str, str], ...]) -> None:
        self.extra = extra

    def _go(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(_ClientCallDetails.of(details, self.extra), request)

    intercept_unary_unary = _go
    intercept_unary_stream = _go
    intercept_stream_unary = _go
    intercept_stream_stream = _go


class _ClientCallDetails(grpc.ClientCallDetails):
    """The sync API's call details are an abstract class: a concrete copy with metadata."""

    def __init__(self, details: Any, metadata: Sequence[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)

    @classmethod
    def of(cls, details: Any, extra: tuple[tuple[str, str], ...]) -> _ClientCallDetails:
        return cls(details, [*(details.metadata or ()), *extra])


def _aio_interceptors(extra: tuple[tuple[str, str], ...]) -> list[Any]:
    class Unary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation: Any, details: Any, req: Any) -> Any:
            return await continuation(_with_metadata(details, extra), req)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation: Any, details: Any, req: Any) -> Any:
            return await continuation(_with_metadata(details, extra), req)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation: Any, details: Any, it: Any) -> Any:
            return await continuation(_with_metadata(details, extra), it)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation: Any, details: Any, it: Any) -> Any:
            return await continuation(_with_metadata(details, extra), it)

    return [Unary(), UnaryStream(), StreamUnary(), StreamStream()]


def sync_channel(
    target: str, security: ChannelSecurity | None = None, options: Options = ()
) -> grpc.Channel:
    """A blocking channel to `target` secured as `security` says."""
    security = security or ChannelSecurity()
    creds = security.credentials()
    if creds is None:
        channel = grpc.insecure_channel(target, options=list(options))
    else:
        channel = grpc.secure_channel(target, creds, options=list(options))
    if security.metadata:
        return grpc.intercept_channel(channel, _SyncToken(security.metadata))
    return channel


def aio_channel(
    target: str, security: ChannelSecurity | None = None, options: Options = ()
) -> grpc.aio.Channel:
    """A grpc.aio channel to `target` secured as `security` says."""
    security = security or ChannelSecurity()
    creds = security.credentials()
    interceptors = _aio_interceptors(security.metadata) if security.metadata else None
    if creds is None:
        return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(target, creds, options=list(options), interceptors=interceptors)
