"""rmctl's output: tables, ``key = value`` detail views, compact resources, JSON in
grpcurl's style, and kubectl's AGE.

What the RM stores was written by others (a user's reason, an EngineConn's report, a
program's log): tables and detail views write its control characters out (``\x1b``,
labelrm_common/text.py) rather than hand them to the terminal; JSON escapes them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO, TypeVar

from google.protobuf import json_format
from labelrm.v1 import resource_manager_pb2

from labelrm_common.quantity import format_bytes, format_cpu
from labelrm_common.text import visible

__all__ = [
    "STATE_NAMES",
    "fmt_age",
    "fmt_bytes",
    "fmt_isolation",
    "fmt_labels",
    "fmt_resource",
    "fmt_time",
    "fmt_usage",
    "opt",
    "print_details",
    "print_json",
    "print_list",
    "print_table",
    "set_table_headers",
    "terminal_text",
    "to_json",
    "visible",
]

T = TypeVar("T")

STATE_NAMES = {
    resource_manager_pb2.TICKET_STATE_UNSPECIFIED: "-",
    resource_manager_pb2.TICKET_STATE_LOCKED: "LOCKED",
    resource_manager_pb2.TICKET_STATE_USED: "USED",
    resource_manager_pb2.TICKET_STATE_RELEASED: "RELEASED",
    resource_manager_pb2.TICKET_STATE_EXPIRED: "EXPIRED",
}


def to_json(message: Any) -> str:
    """A message as JSON in grpcurl's style (proto field names, proto3 JSON mapping)."""
    return str(json_format.MessageToJson(message, preserving_proto_field_name=True, indent=2))


def fmt_bytes(n: int) -> str:
    """Bytes for people: "4Gi" when exact, "23.5Gi" when not (never a KiB count)."""
    return format_bytes(n)


def fmt_resource(r: Any) -> str:
    """A compact one-line form of a resource_pb2.Resource ("-" when unset)."""
    if r is None:
        return "-"
    kind = r.WhichOneof("kind")
    if kind is None:
        return "-"
    if kind == "special":
        return " ".join(f"{k}={v}" for k, v in sorted(r.special.quantities.items())) or "-"
    if kind == "driver_and_yarn":
        return f"driver({_fmt_dims(r.driver_and_yarn.driver)}) {_fmt_yarn(r.driver_and_yarn.yarn)}"
    if kind == "yarn":
        return _fmt_yarn(r.yarn)
    return _fmt_dims(getattr(r, kind))


def _fmt_dims(m: Any) -> str:
    parts = []
    names = {f.name for f in m.DESCRIPTOR.fields}
    if "memory_bytes" in names:
        parts.append(f"mem={fmt_bytes(m.memory_bytes)}")
    if "cpu_millis" in names:
        parts.append(f"cpu={format_cpu(m.cpu_millis)}")
    if "instances" in names:
        parts.append(f"inst={m.instances}")
    return " ".join(parts)


def fmt_usage(u: Any) -> str:
    """A measured ResourceUsage ("-" when unset): memory now and at its peak, CPU over
    the agent's last interval and in total."""
    if u is None:
        return "-"
    return (
        f"mem={fmt_bytes(u.memory_bytes)} peak={fmt_bytes(u.memory_peak_bytes)}"
        f" cpu={u.cpu_millis}m cpu_time={u.cpu_time_micros / 1e6:.1f}s"
    )


def fmt_isolation(i: Any, full: bool = False) -> str:
    """How a node contains its EngineConns: its mode ("cgroup-v1", "none"; "-" when its
    agent did not say), with `full` its controllers and parent cgroups too."""
    if i is None or not i.mode:
        return "-"
    if not full or not i.controllers:
        return str(i.mode)
    return f"{i.mode} ({','.join(i.controllers)}) under {', '.join(i.cgroup_parents)}"


def _fmt_yarn(y: Any) -> str:
    return (
        f"queue={y.queue_name} mem={fmt_bytes(y.queue_memory_bytes)} "
        f"cpu={format_cpu(y.queue_cpu_millis)} inst={y.queue_instances}"
    )


def fmt_time(ts: Any) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return str(ts.ToDatetime().strftime("%Y-%m-%dT%H:%M:%SZ"))


def opt(msg: Any, field: str) -> Any:
    return getattr(msg, field) if msg.HasField(field) else None


def print_details(out: TextIO, rows: Sequence[tuple[str, str]]) -> None:
    """The detail view of one object: ``key = value`` lines, keys aligned."""
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        print(f"{key.ljust(width)} = {visible(value)}", file=out)


def fmt_labels(labels: Iterable[Any]) -> str:
    return ",".join(f"{lb.key}={lb.value}" for lb in labels) or "-"


_TABLE = {"headers": True}


def set_table_headers(on: bool) -> None:
    """Whether tables print their header row (rmctl --no-headers turns it off)."""
    _TABLE["headers"] = on


def print_table(out: TextIO, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Aligned columns with an upper-case header row, kubectl style."""
    all_rows = [[h.upper() for h in header], *([visible(str(c)) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in all_rows) for i in range(len(header))]
    for row in all_rows[0 if _TABLE["headers"] else 1 :]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        print("   ".join([*cells, row[-1]]).rstrip(), file=out)


def terminal_text(text: str, out: TextIO) -> str:
    """Log text as `out` should get it: with its control characters but tab, newline and
    carriage return written out on a terminal (a log can hold anything its program
    printed), as it is into a pipe or a file."""
    return visible(text, keep="\t\n\r") if out.isatty() else text


def print_json(out: TextIO, output: str, message: Any) -> bool:
    """With ``-o json``, print `message` as JSON and return True (the command is done);
    otherwise print nothing and return False."""
    if output != "json":
        return False
    print(to_json(message), file=out)
    return True


def print_list(
    out: TextIO,
    output: str,
    response: Any,
    items: Iterable[T],
    row: Callable[[T, bool], Sequence[str]],
    headers: tuple[Sequence[str], Sequence[str]],
) -> int:
    """A list command's output, exit code 0: the List...Response `response` as JSON with
    ``-o json``; otherwise a table of ``row(item, wide)`` under ``headers`` (normal, wide),
    the wide ones with ``-o wide``."""
    if print_json(out, output, response):
        return 0
    wide = output == "wide"
    print_table(out, headers[1] if wide else headers[0], (row(item, wide) for item in items))
    return 0


def fmt_age(ts: Any, now: datetime | None = None) -> str:
    """kubectl's AGE: 45s, 12m, 5h, 3d ("-" when unset)."""
    if not ts.seconds and not ts.nanos:
        return "-"
    now = now or datetime.now(UTC)
    seconds = max(0, int((now - ts.ToDatetime(tzinfo=UTC)).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
