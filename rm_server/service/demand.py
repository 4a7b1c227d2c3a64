"""DemandService: time-aware demands over gRPC, and their protobuf conversions.

The conversions live here rather than in ``convert.py`` because they concern only this
service; they follow its rules (validate, name the offending field path). Resources,
labels and tickets go through ``convert``.
"""

from __future__ import annotations

import json

import grpc
from google.protobuf.duration_pb2 import Duration
from labelrm.v1 import demand_pb2 as pb
from labelrm.v1 import demand_pb2_grpc as pb_grpc

from labelrm_common.durations import duration
from rm_server.app.demands import Claimed, DemandManager
from rm_server.domain.demands import codec
from rm_server.domain.demands.model import Demand, DemandSpec
from rm_server.domain.demands.state import DemandState
from rm_server.domain.demands.timelang import (
    DEMAND_ID_RE,
    MAX_ITEMS,
    MAX_OFFSET,
    MAX_ROUNDS,
    Absolute,
    AllOf,
    And,
    AnyOf,
    Begin,
    Conditions,
    DeadlineCondition,
    DemandRef,
    DurationCondition,
    End,
    Expr,
    Interval,
    Not,
    Now,
    Or,
    OrderBy,
    Relative,
    Rounds,
    Strategy,
    TimeCondition,
    WindowBudget,
    parse,
)
from rm_server.domain.demands.waits import wait_text
from rm_server.errors import InvalidArgument
from rm_server.service import convert
from rm_server.service.common import ProtoEncoder, idempotency, next_token, page_of, respond

MAX_DEPTH = 32
_STATES = {s: getattr(pb, f"DEMAND_STATE_{s.value}") for s in DemandState}
_STATE_NAMES = {v: k for k, v in _STATES.items()}
_STRATEGIES = {Strategy.STRICT: pb.DEMAND_STRATEGY_STRICT, Strategy.LOOSE: pb.DEMAND_STRATEGY_LOOSE}

# ----- protobuf -> domain ---------------------------------------------------------------------


def _owner(user: str) -> str | None:
    """Whose demand a request names: its ``user`` (the policy has filled in the caller for
    users, and refused another user's name but for admins and proxy users); None when an
    admin (or the dev-mode caller) names nobody: any user's demand of that id."""
    if len(user) > 64:
        raise InvalidArgument("user", "must be at most 64 characters")
    return user or None


def _after(token: str) -> tuple[str, str]:
    """The (user, demand id) a page token continues after (ids are per user)."""
    if not token:
        return "", ""
    try:
        after = json.loads(token)
    except ValueError:
        after = None
    if not (isinstance(after, list) and len(after) == 2 and all(isinstance(a, str) for a in after)):
        raise InvalidArgument("page_token", "is not a token this server issued")
    return after[0], after[1]


def demand_id_of(value: str, field: str = "demand_id") -> str:
    if not DEMAND_ID_RE.fullmatch(value):
        raise InvalidArgument(field, "must be 1-128 of letters, digits and _ . : @ - (not first)")
    return value


def _strategy(value: int, field: str, default: Strategy) -> Strategy:
    if value == pb.DEMAND_STRATEGY_UNSPECIFIED:
        return default
    for strategy, wire in _STRATEGIES.items():
        if wire == value:
            return strategy
    raise InvalidArgument(field, f"unknown strategy {value}")


def _seconds(msg: Duration, field: str) -> int:
    if msg.nanos or msg.seconds < 0 or msg.seconds > MAX_OFFSET:
        raise InvalidArgument(field, f"must be whole seconds between 0 and {MAX_OFFSET}")
    return int(msg.seconds)


def _point(msg: pb.TimePoint, field: str, *, allow_rounds: bool) -> End | None:
    which = msg.WhichOneof("point")
    if which is None:
        return None
    if which == "now":
        if not msg.now:
            raise InvalidArgument(
                f"{field}.now", "must be true when set (unset it for an open end)"
            )
        return Now()
    if which == "absolute":
        return Absolute(convert.time_from_pb(msg.absolute, f"{field}.absolute"))
    if which == "relative":
        return Relative(_seconds(msg.relative, f"{field}.relative"))
    if not allow_rounds:
        raise InvalidArgument(f"{field}.rounds", "^N is only allowed as the end of an interval")
    if msg.rounds > MAX_ROUNDS:
        raise InvalidArgument(f"{field}.rounds", f"must be at most {MAX_ROUNDS}")
    return Rounds(msg.rounds)


def _begin(msg: pb.TimePoint, field: str) -> Begin | None:
    point = _point(msg, field, allow_rounds=False)
    assert not isinstance(point, Rounds)
    return point


def _expr(msg: pb.TimeExpression, field: str, budget: WindowBudget, depth: int = 0) -> Expr:
    which = msg.WhichOneof("expression")
    if which == "interval":
        path = f"{field}.interval"
        begin = _begin(msg.interval.begin, f"{path}.begin")
        end = _point(msg.interval.end, f"{path}.end", allow_rounds=True)
        if isinstance(begin, Absolute) and isinstance(end, Absolute) and end.at < begin.at:
            raise InvalidArgument(f"{path}.end", "must not be before begin")
        exceeded = budget.interval(end)
        if exceeded is not None:
            raise InvalidArgument(field, exceeded)
        return Interval(begin, end)
    if which in ("negation", "all_of", "any_of"):
        exceeded = budget.depth(depth)
        if exceeded is not None:
            raise InvalidArgument(field, exceeded)
    if which == "negation":
        return Not(_expr(msg.negation, f"{field}.negation", budget, depth + 1))
    if which in ("all_of", "any_of"):
        items = getattr(msg, which).expressions
        if not items or len(items) > MAX_ITEMS:
            raise InvalidArgument(f"{field}.{which}", f"must have 1 to {MAX_ITEMS} expressions")
        parts = tuple(
            _expr(e, f"{field}.{which}.expressions[{i}]", budget, depth + 1)
            for i, e in enumerate(items)
        )
        return And(parts) if which == "all_of" else Or(parts)
    raise InvalidArgument(field, "must set interval, all_of, any_of or negation")


def _order(msg: pb.OrderByExpression, field: str, depth: int = 0) -> OrderBy:
    if depth > MAX_DEPTH:
        raise InvalidArgument(field, f"at most {MAX_DEPTH} levels of nesting")
    which = msg.WhichOneof("expression")
    if which == "demand_id":
        return DemandRef(demand_id_of(msg.demand_id, f"{field}.demand_id"))
    if which in ("all_of", "any_of"):
        items = getattr(msg, which).expressions
        if not items or len(items) > MAX_ITEMS:
            raise InvalidArgument(f"{field}.{which}", f"must have 1 to {MAX_ITEMS} expressions")
        parts = tuple(
            _order(e, f"{field}.{which}.expressions[{i}]", depth + 1) for i, e in enumerate(items)
        )
        return AllOf(parts) if which == "all_of" else AnyOf(parts)
    raise InvalidArgument(field, "must set demand_id, all_of or any_of")


def conditions_from_pb(msg: pb.TimeConditions, field: str = "time_conditions") -> Conditions:
    """The structured form, validated like the text (every error names its field path)."""
    start = duration = deadline = order = None
    if msg.HasField("start"):
        s = msg.start
        window = f"{field}.start.time"
        expr = _expr(s.time, window, WindowBudget()) if s.HasField("time") else Interval()
        start = TimeCondition(
            expr, _strategy(s.strategy, f"{field}.start.strategy", Strategy.STRICT)
        )
    if msg.HasField("duration"):
        d = msg.duration
        seconds = _seconds(d.duration, f"{field}.duration.duration")
        strategy = _strategy(d.strategy, f"{field}.duration.strategy", Strategy.LOOSE)
        duration = DurationCondition(seconds, strategy)
    if msg.HasField("deadline"):
        dl = msg.deadline
        point = _begin(dl.time, f"{field}.deadline.time")
        if point is None:
            raise InvalidArgument(f"{field}.deadline.time", "must be set")
        strategy = _strategy(dl.strategy, f"{field}.deadline.strategy", Strategy.LOOSE)
        deadline = DeadlineCondition(point, strategy)
    if msg.HasField("order_by"):
        order = _order(msg.order_by, f"{field}.order_by")
    return Conditions(None, start, duration, deadline, order)


def spec_from_pb(request: pb.SubmitDemandRequest) -> DemandSpec:
    demand_id = demand_id_of(request.demand_id)
    if len(request.user) > 64:
        raise InvalidArgument("user", "must be at most 64 characters")
    labels = convert.labels_from_pb(request.labels)
    resource = convert.resource_from_pb(request.resource, "resource")
    which = request.WhichOneof("conditions")
    conditions = Conditions()
    if which == "time_conditions_text":
        with convert.field_of("time_conditions_text"):
            conditions = parse(request.time_conditions_text)
    elif which == "time_conditions":
        conditions = conditions_from_pb(request.time_conditions)
    return DemandSpec(demand_id, request.user, labels, resource, conditions)


# ----- domain -> protobuf ---------------------------------------------------------------------


def _point_to_pb(p: End | None) -> pb.TimePoint | None:
    if p is None:
        return None
    if isinstance(p, Now):
        return pb.TimePoint(now=True)
    if isinstance(p, Absolute):
        return pb.TimePoint(absolute=convert.ts(p.at))
    if isinstance(p, Relative):
        return pb.TimePoint(relative=duration(p.seconds))
    return pb.TimePoint(rounds=p.count)


def _expr_to_pb(e: Expr) -> pb.TimeExpression:
    if isinstance(e, Interval):
        return pb.TimeExpression(
            interval=pb.TimeInterval(begin=_point_to_pb(e.begin), end=_point_to_pb(e.end))
        )
    if isinstance(e, And | Or):
        items = pb.TimeExpressionList(expressions=[_expr_to_pb(i) for i in e.items])
        return (
            pb.TimeExpression(all_of=items)
            if isinstance(e, And)
            else pb.TimeExpression(any_of=items)
        )
    if isinstance(e, Not):
        return pb.TimeExpression(negation=_expr_to_pb(e.item))
    raise ValueError(f"not a written expression: {e!r}")


def _order_to_pb(o: OrderBy) -> pb.OrderByExpression:
    if isinstance(o, DemandRef):
        return pb.OrderByExpression(demand_id=o.demand_id)
    items = pb.OrderByList(expressions=[_order_to_pb(i) for i in o.items])
    if isinstance(o, AllOf):
        return pb.OrderByExpression(all_of=items)
    return pb.OrderByExpression(any_of=items)


def conditions_to_pb(c: Conditions) -> pb.TimeConditions:
    out = pb.TimeConditions()
    if c.start is not None:
        out.start.CopyFrom(
            pb.StartCondition(
                time=_expr_to_pb(c.start.expr), strategy=_STRATEGIES[c.start.strategy]
            )
        )
    if c.duration is not None:
        out.duration.CopyFrom(
            pb.DurationCondition(
                duration=duration(c.duration.seconds), strategy=_STRATEGIES[c.duration.strategy]
            )
        )
    if c.deadline is not None:
        out.deadline.CopyFrom(
            pb.DeadlineCondition(
                time=_point_to_pb(c.deadline.point), strategy=_STRATEGIES[c.deadline.strategy]
            )
        )
    if c.order_by is not None:
        out.order_by.CopyFrom(_order_to_pb(c.order_by))
    return out


def demand_to_pb(d: Demand) -> pb.Demand:
    return pb.Demand(
        demand_id=d.demand_id,
        state=_STATES[d.state],
        user=d.user,
        labels=convert.labels_to_pb(d.labels),
        charged_labels=list(d.charged_labels),
        resource=convert.resource_to_pb(d.resource),
        time_conditions=conditions_to_pb(d.conditions),
        time_conditions_text=codec.format_text(d.conditions),
        reason=d.reason,
        submit_time=convert.ts(d.submitted_at),
        update_time=convert.ts(d.updated_at),
        planned_start_time=convert.ts(d.planned_start),
        plan_start_time=convert.ts(d.plan_start),
        plan_end_time=convert.ts(d.plan_end),
        slip=duration(d.slip.total_seconds()),
        passed_over_rounds=d.rounds,
        ticket_id=d.ticket_id or "",
        allocate_time=convert.ts(d.allocated_at),
        claim_expire_time=convert.ts(d.claim_expires_at),
        claim_time=convert.ts(d.claimed_at),
        end_time=convert.ts(d.ended_at),
        overruns=list(d.overruns),
        events=[
            pb.DemandEvent(
                from_state=_STATES[e.from_state] if e.from_state else pb.DEMAND_STATE_UNSPECIFIED,
                to_state=_STATES[e.to_state],
                time=convert.ts(e.at),
                reason=e.reason,
            )
            for e in d.events
        ],
        waiting_for=[
            pb.OrderByWait(
                demand_id=p.demand_id,
                state=_STATES[p.state] if p.state else pb.DEMAND_STATE_UNSPECIFIED,
                planned_end_time=convert.ts(p.planned_end),
            )
            for p in (d.order_wait.pending if d.order_wait else ())
        ],
        waiting=wait_text(d.order_wait),
        order_by_missing_time=convert.ts(d.order_wait.missing_by if d.order_wait else None),
    )


_CANCEL = ProtoEncoder[Demand](lambda d: pb.CancelDemandResponse(demand=demand_to_pb(d)))
_CLAIM = ProtoEncoder[Claimed](
    lambda c: pb.ClaimDemandResponse(
        demand=demand_to_pb(c.demand), ticket=convert.ticket_to_pb(c.ticket)
    )
)


class DemandServicer(pb_grpc.DemandServiceServicer):
    def __init__(self, demands: DemandManager) -> None:
        self.demands = demands

    async def SubmitDemand(
        self, request: pb.SubmitDemandRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitDemandResponse:
        demand, created = await self.demands.submit(spec_from_pb(request))
        return pb.SubmitDemandResponse(demand=demand_to_pb(demand), created=created)

    async def GetDemand(
        self, request: pb.GetDemandRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetDemandResponse:
        demand = await self.demands.get(_owner(request.user), demand_id_of(request.demand_id))
        return pb.GetDemandResponse(demand=demand_to_pb(demand))

    async def ListDemands(
        self, request: pb.ListDemandsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDemandsResponse:
        page = page_of(request)
        state = ""
        if request.state != pb.DEMAND_STATE_UNSPECIFIED:
            if request.state not in _STATE_NAMES:
                raise InvalidArgument("state", f"unknown demand state {request.state}")
            state = _STATE_NAMES[request.state].value
        if len(request.user) > 64:
            raise InvalidArgument("user", "must be at most 64 characters")
        found = await self.demands.list_demands(
            _after(page.after), page.size + 1, state, request.user
        )
        return pb.ListDemandsResponse(
            demands=[demand_to_pb(d) for d in found[: page.size]],
            next_page_token=next_token(found, page, lambda d: json.dumps([d.user, d.demand_id])),
        )

    async def CancelDemand(
        self, request: pb.CancelDemandRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelDemandResponse:
        demand_id = demand_id_of(request.demand_id)
        if len(request.reason) > 512:
            raise InvalidArgument("reason", "must be at most 512 characters")
        outcome = await self.demands.cancel(
            idempotency("CancelDemand", request),
            _owner(request.user),
            demand_id,
            request.reason,
            _CANCEL,
        )
        return respond(outcome, _CANCEL, pb.CancelDemandResponse)

    async def ClaimDemand(
        self, request: pb.ClaimDemandRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClaimDemandResponse:
        demand_id = demand_id_of(request.demand_id)
        outcome = await self.demands.claim(
            idempotency("ClaimDemand", request), _owner(request.user), demand_id, _CLAIM
        )
        return respond(outcome, _CLAIM, pb.ClaimDemandResponse)
