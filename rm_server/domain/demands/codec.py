"""Conditions to and from their canonical JSON (storage, definition hashes) and the
paper's text (display). ``parse(format_text(c)) == c`` and
``from_json(to_json(c)) == c`` for every Conditions value."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from rm_server.domain.demands.timelang import (
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
)
from rm_server.domain.errors import DomainError

_PLAIN_ID = re.compile(r"[0-9]+|[A-Za-z][A-Za-z0-9_]*")


class CodecError(DomainError):
    """Stored JSON that does not describe conditions (a bug or a corrupted row)."""


# ----- canonical JSON -------------------------------------------------------------------------


def _point_json(p: End | None) -> Any:
    if p is None:
        return None
    if isinstance(p, Now):
        return {"now": True}
    if isinstance(p, Absolute):
        return {"at": p.at.astimezone(UTC).isoformat()}
    if isinstance(p, Relative):
        return {"after": p.seconds}
    return {"rounds": p.count}


def _expr_json(e: Expr) -> Any:
    if isinstance(e, Interval):
        return {"interval": [_point_json(e.begin), _point_json(e.end)]}
    if isinstance(e, And):
        return {"and": [_expr_json(i) for i in e.items]}
    if isinstance(e, Or):
        return {"or": [_expr_json(i) for i in e.items]}
    if isinstance(e, Not):
        return {"not": _expr_json(e.item)}
    raise CodecError(f"only unresolved expressions are stored, not {e!r}")


def _order_json(o: OrderBy) -> Any:
    if isinstance(o, DemandRef):
        return {"id": o.demand_id}
    key = "all" if isinstance(o, AllOf) else "any"
    return {key: [_order_json(i) for i in o.items]}


def to_json(c: Conditions) -> dict[str, Any]:
    """The canonical JSON form: explicit keys, only what is set."""
    out: dict[str, Any] = {}
    if c.demand_id is not None:
        out["demand_id"] = c.demand_id
    if c.start is not None:
        out["start"] = {"time": _expr_json(c.start.expr), "strategy": c.start.strategy.value}
    if c.duration is not None:
        out["duration"] = {"seconds": c.duration.seconds, "strategy": c.duration.strategy.value}
    if c.deadline is not None:
        out["deadline"] = {
            "point": _point_json(c.deadline.point),
            "strategy": c.deadline.strategy.value,
        }
    if c.order_by is not None:
        out["order_by"] = _order_json(c.order_by)
    return out


def _point(data: Any) -> End | None:
    if data is None:
        return None
    if not isinstance(data, dict) or len(data) != 1:
        raise CodecError(f"bad point {data!r}")
    ((key, value),) = data.items()
    if key == "now":
        return Now()
    if key == "at":
        return Absolute(datetime.fromisoformat(value))
    if key == "after":
        return Relative(int(value))
    if key == "rounds":
        return Rounds(int(value))
    raise CodecError(f"bad point {data!r}")


def _begin(data: Any) -> Begin | None:
    p = _point(data)
    if isinstance(p, Rounds):
        raise CodecError("^N cannot begin an interval")
    return p


def _expr(data: Any) -> Expr:
    if not isinstance(data, dict) or len(data) != 1:
        raise CodecError(f"bad expression {data!r}")
    ((key, value),) = data.items()
    if key == "interval":
        return Interval(_begin(value[0]), _point(value[1]))
    if key == "and":
        return And(tuple(_expr(i) for i in value))
    if key == "or":
        return Or(tuple(_expr(i) for i in value))
    if key == "not":
        return Not(_expr(value))
    raise CodecError(f"bad expression {data!r}")


def _order(data: Any) -> OrderBy:
    if not isinstance(data, dict) or len(data) != 1:
        raise CodecError(f"bad OrderBy {data!r}")
    ((key, value),) = data.items()
    if key == "id":
        return DemandRef(str(value))
    if key in ("all", "any"):
        items = tuple(_order(i) for i in value)
        return AllOf(items) if key == "all" else AnyOf(items)
    raise CodecError(f"bad OrderBy {data!r}")


def from_json(data: Any) -> Conditions:
    if not isinstance(data, dict):
        raise CodecError(f"conditions must be an object, got {data!r}")
    start = duration = deadline = order = None
    if "start" in data:
        s = data["start"]
        start = TimeCondition(_expr(s["time"]), Strategy(s["strategy"]))
    if "duration" in data:
        d = data["duration"]
        duration = DurationCondition(int(d["seconds"]), Strategy(d["strategy"]))
    if "deadline" in data:
        d = data["deadline"]
        point = _begin(d["point"])
        if point is None:
            raise CodecError("a deadline needs a time")
        deadline = DeadlineCondition(point, Strategy(d["strategy"]))
    if "order_by" in data:
        order = _order(data["order_by"])
    return Conditions(data.get("demand_id"), start, duration, deadline, order)


def canonical_bytes(value: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no spaces) for hashing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def definition_hash(*parts: Any) -> bytes:
    """The fingerprint of a demand definition: same parts, same bytes."""
    return hashlib.sha256(canonical_bytes(list(parts))).digest()


# ----- the paper's text -----------------------------------------------------------------------


def format_offset(seconds: int) -> str:
    """30s, 5m, 2h, 1d or combinations such as 1h30m (without the '+')."""
    if seconds == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(out)


def _point_text(p: End | None) -> str:
    if p is None:
        return ""
    if isinstance(p, Now):
        return "NOW"
    if isinstance(p, Absolute):
        return '"' + p.at.astimezone(UTC).isoformat().replace("+00:00", "Z") + '"'
    if isinstance(p, Relative):
        return "+" + format_offset(p.seconds)
    return f"^{p.count}"


def _expr_text(e: Expr) -> str:
    if isinstance(e, Interval):
        if e.begin is None and e.end is None:
            return "[]"
        return f"[{_point_text(e.begin)}, {_point_text(e.end)}]"
    if isinstance(e, And | Or):
        op = "AND" if isinstance(e, And) else "OR"
        return "{" + op + ": [" + ", ".join(_expr_text(i) for i in e.items) + "]}"
    if isinstance(e, Not):
        return "{NOT: " + _expr_text(e.item) + "}"
    raise CodecError(f"only unresolved expressions have a text form, not {e!r}")


def _id_text(demand_id: str) -> str:
    # Digits (1200) and identifiers (job_7) read back unquoted; anything else is quoted.
    return demand_id if _PLAIN_ID.fullmatch(demand_id) else json.dumps(demand_id)


def _order_text(o: OrderBy) -> str:
    if isinstance(o, DemandRef):
        return _id_text(o.demand_id)
    op = "AND" if isinstance(o, AllOf) else "OR"
    return "{" + op + ": [" + ", ".join(_order_text(i) for i in o.items) + "]}"


def format_text(c: Conditions) -> str:
    """The conditions in the paper's style, e.g. ``{OrderBy: 1200, Duration: {...}}``."""
    parts = []
    if c.demand_id is not None:
        parts.append(f"DemandID: {_id_text(c.demand_id)}")
    if c.start is not None:
        parts.append(
            f"Start: {{Time: {_expr_text(c.start.expr)}, Strategy: {c.start.strategy.value}}}"
        )
    if c.duration is not None:
        d = c.duration
        parts.append(f"Duration: {{Time: +{format_offset(d.seconds)}, Strategy: {d.strategy}}}")
    if c.deadline is not None:
        d2 = c.deadline
        parts.append(f"DeadLine: {{Time: {_point_text(d2.point)}, Strategy: {d2.strategy}}}")
    if c.order_by is not None:
        parts.append(f"OrderBy: {_order_text(c.order_by)}")
    return "{" + ", ".join(parts) + "}"
