"""grpcio (aio server) crashes when a response-stream generator outlives its call.

Standalone, no labelrm code: a unary-stream handler written as an async generator
streams messages; the client reads one and cancels. grpcio cancels the handler task
while it is sending, which leaves the generator suspended at its `yield`. The garbage
collector later closes it (the event loop's async-generator finaliser, in a new task),
after grpcio has finished the call, and the generator's `finally` asks the context for
the peer: the process dies with SIGSEGV inside cygrpc.

    python scripts/grpc_stream_segfault.py               # crashes (exit -11 / 139)
    python scripts/grpc_stream_segfault.py --workaround  # 300 rounds, exit 0

The workaround (what rm_server/service/interceptor.py does): hand grpcio a coroutine
that drives the generator, writes each response with `context.write` and closes the
generator (`contextlib.aclosing`) inside the call's own handler task.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc

ROUNDS = 300


async def responses(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    try:
        while True:
            yield b"x" * 65536
    finally:
        context.peer()  # fine while the call runs; fatal after it ended


async def written(request: bytes, context: grpc.aio.ServicerContext) -> None:
    async with contextlib.aclosing(responses(request, context)) as stream:
        async for item in stream:
            await context.write(item)


class Handler(grpc.GenericRpcHandler):
    def __init__(self, behaviour: Any) -> None:
        self.behaviour = behaviour

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return grpc.unary_stream_rpc_method_handler(self.behaviour)


async def main(workaround: bool) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Handler(written if workaround else responses),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.unary_stream("/repro.Repro/Stream")
        for i in range(ROUNDS):
            call = method(b"")
            await call.read()
            call.cancel()
            await asyncio.sleep(0.01)
            if i % 10 == 0:
                gc.collect()
    await server.stop(0)
    print(f"grpcio {grpc.__version__}: no crash in {ROUNDS} rounds")


if __name__ == "__main__":
    asyncio.run(main("--workaround" in sys.argv[1:]))
