"""How the agent sends its heartbeats: on one long-lived HeartbeatStream, a message per
beat, which costs the RM about a third of a Heartbeat call; unary Heartbeat calls
against an RM that does not serve the stream.

    no stream --send--> open stream --answer--> (kept for the next beat)
         ^                   |
         |                   +--any failure: the stream is dropped, the error raised
         |                       (a retry opens a new one and resends the same beat)
         +--UNIMPLEMENTED: unary calls from then on

The sequence numbers make a resend on a new stream safe: the RM answers a beat it has
already recorded with the answer it stored for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from labelrm.v1 import resource_manager_pb2 as rm_pb

log = logging.getLogger(__name__)


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class HeartbeatSender:
    """Sends one heartbeat at a time (see the module doc); `timeout` bounds each answer."""

    def __init__(self, rm: Any, timeout: float = 10.0, *, unary: bool = False) -> None:
        self._rm = rm  # a ResourceManagerServiceStub
        self._timeout = timeout
        self._stream: Any = None
        # Heartbeat calls: asked for, or the RM does not serve HeartbeatStream.
        self.unary = unary
        self.streams_opened = 0

    def open(self) -> None:
        """Open the stream now, before the first beat needs it (a no-op when calling)."""
        if self._stream is None and not self.unary:
            self._stream = self._rm.HeartbeatStream()
            self.streams_opened += 1

    async def send(self, request: rm_pb.HeartbeatRequest) -> rm_pb.HeartbeatResponse:
        """The RM's answer to `request`; raises grpc.aio.AioRpcError when there is none."""
        if self.unary:
            response: rm_pb.HeartbeatResponse = await self._rm.Heartbeat(
                request, timeout=self._timeout
            )
            return response
        self.open()
        stream = self._stream
        try:
            await stream.write(rm_pb.HeartbeatStreamRequest(heartbeat=request))
        except asyncio.InvalidStateError:  # the call had ended: its status says why
            self.close()
            code = await stream.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return await self._fall_back(request)
            if code in (None, grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
                code = grpc.StatusCode.UNAVAILABLE  # ended under us: a new one will do
            raise _rpc_error(code, "the heartbeat stream had ended") from None
        except grpc.aio.AioRpcError as exc:
            # The write failed below gRPC's API (INTERNAL, "Internal error from Core"):
            # the connection went away under the stream (an RM restarting) before its
            # status reached us. Nothing was answered: a new stream will do.
            self.close()
            raise _rpc_error(
                grpc.StatusCode.UNAVAILABLE, f"heartbeat stream broke: {exc.details()}"
            ) from exc
        try:
            answer = await asyncio.wait_for(stream.read(), self._timeout)
        except grpc.aio.AioRpcError as exc:
            self.close()
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return await self._fall_back(request)
            if exc.code() == grpc.StatusCode.CANCELLED:  # by the RM (we cancel only closed ones)
                raise _rpc_error(
                    grpc.StatusCode.UNAVAILABLE, "the RM cancelled the stream"
                ) from exc
            raise
        except TimeoutError:
            self.close()
            raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer on the stream") from None
        if answer is grpc.aio.EOF:  # the RM closed the stream (it is shutting down)
            self.close()
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, "the RM closed the heartbeat stream")
        result: rm_pb.HeartbeatResponse = answer.heartbeat
        return result

    async def _fall_back(self, request: rm_pb.HeartbeatRequest) -> rm_pb.HeartbeatResponse:
        log.info("the RM does not serve HeartbeatStream: heartbeats go as Heartbeat calls")
        self.unary = True
        return await self.send(request)

    def close(self) -> None:
        """Drop the stream (the next beat opens another)."""
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
