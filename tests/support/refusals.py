"""What the RM says of a refused request: its code, reason and field."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import grpc
import pytest


def reason_of(err: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a refusal ("" when it has none)."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(err)
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


async def refused(
    call: Awaitable[Any], code: grpc.StatusCode, reason: str | None = None
) -> grpc.aio.AioRpcError:
    """Await `call`, which must be refused with `code` (and, when given, the ErrorInfo
    `reason`): a refusal for any other cause (INTERNAL, say) fails the test. Returns
    the error for further checks."""
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    assert exc.value.code() == code, (exc.value.code(), exc.value.details())
    if reason is not None:
        assert reason_of(exc.value) == reason, (reason_of(exc.value), exc.value.details())
    return exc.value


def bad_field(err: grpc.aio.AioRpcError) -> str:
    """The field a BadRequest detail of `err` names."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    for detail in rpc_status.from_call(err).details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            return str(bad.field_violations[0].field)
    raise AssertionError(f"no BadRequest detail in {err}")
