"""UsageService: the usage ledger's reports over gRPC, and their protobuf conversions.

Who sees what is the access policy's (security/policy.py): a user's `user` is set to
themselves, naming another user is PERMISSION_DENIED, as for every list."""

from __future__ import annotations

from datetime import datetime, timedelta

import grpc
from labelrm.v1 import usage_pb2 as pb
from labelrm.v1 import usage_pb2_grpc as pb_grpc

from rm_server.app.core import RMCore
from rm_server.domain.usage import US_PER_SECOND, UsageGroup, UsageQuery, efficiency, hour_of
from rm_server.errors import InvalidArgument
from rm_server.service.common import next_token, page_of
from rm_server.service.convert import fill_time, time_from_pb

DEFAULT_PERIOD = timedelta(days=7)
# The longest period one report sums (a year of hours): the cost of a call is bounded
# before it runs (the ledger's index reads one user's hours in order).
MAX_PERIOD = timedelta(days=366)
_GROUPINGS = {
    pb.USAGE_GROUPING_UNSPECIFIED: "user",
    pb.USAGE_GROUPING_USER: "user",
    pb.USAGE_GROUPING_LABEL: "label",
    pb.USAGE_GROUPING_ENGINE_TYPE: "engine_type",
    pb.USAGE_GROUPING_USER_CREATOR: "user_creator",
    pb.USAGE_GROUPING_HOUR: "hour",
}


class UsageServicer(pb_grpc.UsageServiceServicer):
    def __init__(self, core: RMCore) -> None:
        self.core = core

    async def GetUsage(
        self, request: pb.GetUsageRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetUsageResponse:
        page = page_of(request)
        since, until = self._period(request)
        group_by = _GROUPINGS.get(request.group_by)
        if group_by is None:
            raise InvalidArgument("group_by", f"unknown grouping {request.group_by}")
        if len(request.user) > 64:
            raise InvalidArgument("user", "must be at most 64 characters")
        # `user` is set by the access policy for every caller but admins and proxy users.
        query = UsageQuery(group_by, since, until, request.user or None, page.after, page.size + 1)
        groups = await self.core.usage.report(query)
        response = pb.GetUsageResponse(next_page_token=next_token(groups, page, lambda g: g.key))
        fill_time(response.since, since)
        fill_time(response.until, until)
        for group in groups[: page.size]:
            fill_usage_row(response.rows.add(), group)
        return response

    def _period(self, request: pb.GetUsageRequest) -> tuple[datetime, datetime]:
        """[since, until) in whole hours; INVALID_ARGUMENT naming the field otherwise."""
        now = self.core.clock.now()
        until = time_from_pb(request.until, "until") if request.HasField("until") else now
        if request.HasField("since"):
            since = time_from_pb(request.since, "since")
        else:
            since = until - DEFAULT_PERIOD
        since, until = (
            hour_of(since),
            hour_of(until - timedelta(microseconds=1)) + timedelta(hours=1),
        )
        if since >= until:
            raise InvalidArgument("since", "must be before until")
        if until - since > MAX_PERIOD:
            raise InvalidArgument("since", f"the period must be at most {MAX_PERIOD.days} days")
        return since, until


def fill_usage_row(msg: pb.UsageRow, group: UsageGroup) -> None:
    """A ledger group (x microseconds) into a UsageRow (seconds, efficiencies)."""
    a = group.amounts
    msg.key = group.key
    msg.tickets = a["tickets"]
    for dim, amount in sorted(group.granted.items()):
        msg.granted[dim] = amount / US_PER_SECOND
    msg.measured_memory_byte_seconds = a["measured_memory"] / US_PER_SECOND
    msg.measured_cpu_seconds = a["measured_cpu"] / US_PER_SECOND
    msg.measured_granted_memory_byte_seconds = a["measured_granted_memory"] / US_PER_SECOND
    # millicore x us -> core-seconds
    msg.measured_granted_cpu_core_seconds = a["measured_granted_cpu"] / (1000 * US_PER_SECOND)
    memory = efficiency(a["measured_memory"], a["measured_granted_memory"])
    if memory is not None:
        msg.memory_efficiency = memory
    cpu = efficiency(a["measured_cpu"] * 1000, a["measured_granted_cpu"])
    if cpu is not None:
        msg.cpu_efficiency = cpu
    msg.engine_conns = a["engine_conns"]
    msg.engine_conns_failed = a["engine_conns_failed"]
    msg.engine_conn_seconds = a["engine_conn_time"] / US_PER_SECOND
    msg.demands_planned = a["demands_planned"]
    msg.demands_allocated = a["demands_allocated"]
    msg.demands_failed = a["demands_failed"]
