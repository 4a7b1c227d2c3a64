"""rm-server with SO_REUSEPORT on its gRPC listener, so that the benchmarks can run
several server processes on one port (replicas of one RM on one host; the kernel
spreads connections over them). Same command line as rm-server.

    python -m bench.rm_worker --listen 127.0.0.1:7100 --database-url URL ...
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

_server = grpc.aio.server


def _reuseport_server(*args: Any, **kwargs: Any) -> Any:
    options = [o for o in kwargs.get("options") or () if o[0] != "grpc.so_reuseport"]
    kwargs["options"] = [*options, ("grpc.so_reuseport", 1)]
    return _server(*args, **kwargs)


grpc.aio.server = _reuseport_server

if __name__ == "__main__":
    from rm_server.main import main

    raise SystemExit(main())
