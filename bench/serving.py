"""What the benchmarks and the tests both need to run rm-server processes: a free port,
and waiting until a server answers SERVING (one definition for both)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import grpc


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NotServing(RuntimeError):
    """The server exited, or did not answer SERVING in time (the message says which,
    with what `describe` told of it)."""


def wait_serving(
    target: str,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    describe: Callable[[], str] = lambda: "",
    tls_ca: str = "",
) -> None:
    """Poll the standard health service at `target` until SERVING, with a deadline; if
    `proc` (the server) exits first, give up at once. NotServing carries `describe()`
    (the end of the server's log, say). `tls_ca`: the server speaks TLS with a
    certificate of this CA."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if tls_ca:
        creds = grpc.ssl_channel_credentials(Path(tls_ca).read_bytes())
        opened = grpc.secure_channel(target, creds)
    else:
        opened = grpc.insecure_channel(target)
    deadline = time.monotonic() + timeout
    with opened as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise NotServing(f"rm-server {target} exited with {proc.returncode}:\n{describe()}")
            with contextlib.suppress(grpc.RpcError):
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.1)
    raise NotServing(f"rm-server {target} not serving after {timeout}s:\n{describe()}")
