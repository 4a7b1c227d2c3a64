"""How the agent sends its heartbeats: on one long-lived HeartbeatStream, a message per
beat, which costs the RM about a third of a Heartbeat call; unary Heartbeat calls
against an RM that does not serve the stream.

    no stream --send--> open stream --answer--> (kept for the next beat)
         ^                   |
         |                   +--any failure: the stream is dropped, the error raised
         |                       (a retry opens a new one and resends the same beat)
         +--UNIMPLEMENTED: unary calls from then on
         +--ended before its first answer with no word why (INTERNAL, which can mask
            the refusal of an RM without the stream): this beat as a call, the next
            one on a new stream

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
        self._answered = False  # the stream has answered a beat

    def open(self) -> None:
        """Open the stream now, before the first beat needs it (a no-op when calling)."""
        if self._stream is None and not self.unary:
            self._stream = self._rm.HeartbeatStream()
            self._answered = False
            self.streams_opened += 1

    async def send(self, request: rm_pb.HeartbeatRequest) -> rm_pb.HeartbeatResponse:
        """The RM's answer to `request`; raises grpc.aio.AioRpcError when there is none."""
        if self.unary:
            return await self._call(request)
        self.open()
        stream = self._stream
        answered = self._answered
        try:
            await stream.write(rm_pb.HeartbeatStreamRequest(heartbeat=request))
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
            # The call ended under the write, and its status says why. The write may
            # meet that status (an RM without the stream refuses it as it opens, so
            # whether the write or the read meets the refusal is a race), or fail below
            # gRPC's API first (INTERNAL, "Internal error from Core") while the status is
            # on its way: it is awaited, read before the stream is cancelled.
            code = await self._final_status(stream)
            self.close()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return await self._fall_back(request)
            if not answered and code in (None, grpc.StatusCode.INTERNAL):
                # A stream that never answered ended with no word why: core's INTERNAL can
                # mask an RM's refusal of the stream. This beat goes as a call (which
                # every RM serves; nothing was answered on the stream), the next one tries
                # a stream again.
                return await self._call(request)
            ended = f"the heartbeat stream had ended ({code.name if code else 'no status'})"
            if code in (
                None,
                grpc.StatusCode.OK,
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.INTERNAL,
            ):
                code = grpc.StatusCode.UNAVAILABLE  # ended under us: a new one will do
            raise _rpc_error(code, ended) from None
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
        self._answered = True
        result: rm_pb.HeartbeatResponse = answer.heartbeat
        return result

    async def _call(self, request: rm_pb.HeartbeatRequest) -> rm_pb.HeartbeatResponse:
        response: rm_pb.HeartbeatResponse = await self._rm.Heartbeat(request, timeout=self._timeout)
        return response

    async def _final_status(self, stream: Any) -> grpc.StatusCode | None:
        """The status of a call that has ended or is ending (None: none within the
        timeout)."""
        try:
            code: grpc.StatusCode = await asyncio.wait_for(stream.code(), self._timeout)
        except TimeoutError:
            return None
        return code

    async def _fall_back(self, request: rm_pb.HeartbeatRequest) -> rm_pb.HeartbeatResponse:
        log.info("the RM does not serve HeartbeatStream: heartbeats go as Heartbeat calls")
        self.unary = True
        return await self.send(request)

    def close(self) -> None:
        """Drop the stream (the next beat opens another)."""
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
