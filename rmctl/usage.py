"""`rmctl usage`: who used what over a period, granted against measured (like Slurm's
sreport for the totals and seff for the efficiency), from the RM's usage ledger.

    rmctl usage [--by user|label|engine-type|user-creator|hour] [--since WHEN]
                [--until WHEN] [--user NAME] [-o table|wide|json|csv]

WHEN is a date or time (2026-01-01, 2026-01-01T08:00, UTC unless it names a zone), or a
time before now: 7d, 36h, 90m. An admin sees everyone's usage; a user their own.
"""

from __future__ import annotations

import argparse
import csv
import re
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from labelrm.v1 import usage_pb2

from labelrm_client import RMClient
from rmctl.format import print_table, to_json

_AGO = re.compile(r"([0-9]+)([dhm])")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}
GIB_HOUR = 1024**3 * 3600  # byte-seconds in a GiB-hour
CORE_HOUR = 1000 * 3600  # millicore-seconds in a core-hour
_GROUPINGS = ("user", "label", "engine-type", "user-creator", "hour")
_HEADER = (
    "tickets", "mem_granted_gib_h", "cpu_granted_core_h", "mem_used_gib_h", "cpu_used_core_h",
    "mem_eff", "cpu_eff", "engineconns", "engineconn_h",
)  # fmt: skip
_WIDE = ("engineconns_failed", "demands_planned", "demands_allocated", "demands_failed", "other")
# -o csv: the exact figures, in the API's units (seconds).
_CSV = (
    "tickets", "granted_memory_byte_seconds", "granted_cpu_millicore_seconds",
    "measured_memory_byte_seconds", "measured_cpu_seconds",
    "measured_granted_memory_byte_seconds", "measured_granted_cpu_core_seconds",
    "memory_efficiency", "cpu_efficiency", "engine_conns", "engine_conns_failed",
    "engine_conn_seconds", "demands_planned", "demands_allocated", "demands_failed",
)  # fmt: skip


def when(text: str) -> datetime:
    """A --since/--until value: an ISO date or time (UTC unless it says), or a span
    before now ("7d", "36h", "90m")."""
    ago = _AGO.fullmatch(text.strip())
    if ago:
        return datetime.now(UTC) - timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
    try:
        found = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a date or time (2026-01-01, 2026-01-01T08:00) or a span before now"
            f" (7d, 36h, 90m), got {text!r}"
        ) from exc
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


def register(cmds: Any) -> None:
    """Register ``rmctl usage`` on rmctl's sub-command parsers."""
    c = cmds.add_parser(
        "usage",
        help="usage over a period: granted against measured (sreport, seff)",
        description=__doc__.split("\n\n")[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--by", choices=_GROUPINGS, default="user", help="what to sum by")
    c.add_argument("--since", type=when, default=None, metavar="WHEN", help="default: 7d")
    c.add_argument("--until", type=when, default=None, metavar="WHEN", help="default: now")
    c.add_argument("--user", default="", help="one user's usage (admins; a user gets their own)")
    # Its own -o: csv is for this report only (rmctl's global -o has no csv).
    c.add_argument(
        "-o", "--output", choices=("table", "wide", "json", "csv"), default=argparse.SUPPRESS
    )
    c.set_defaults(func=cmd_usage)


def cmd_usage(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl usage`: every group of the period, as a table, JSON or CSV."""
    rows = list(client.get_usage(args.by.replace("-", "_"), args.since, args.until, args.user))
    output = args.output if args.output in ("table", "wide", "json", "csv") else "table"
    if output == "json":
        print(to_json(usage_pb2.GetUsageResponse(rows=rows)), file=out)
    elif output == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([args.by.replace("-", "_"), *_CSV])
        writer.writerows([r.key, *_csv_cells(r)] for r in rows)
    else:
        wide = output == "wide"
        header = [args.by.replace("-", "_"), *_HEADER, *(_WIDE if wide else ())]
        print_table(out, header, [_table_row(r, wide) for r in rows])
    return 0


def _efficiency(row: usage_pb2.UsageRow, field: str) -> float | None:
    return getattr(row, field) if row.HasField(field) else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float) -> str:
    return f"{value:.2f}"


def _table_row(r: usage_pb2.UsageRow, wide: bool) -> list[str]:
    granted = dict(r.granted)
    cells = [
        r.key or "-",
        str(r.tickets),
        _num(granted.pop("memory_bytes", 0.0) / GIB_HOUR),
        _num(granted.pop("cpu_millis", 0.0) / CORE_HOUR),
        _num(r.measured_memory_byte_seconds / GIB_HOUR),
        _num(r.measured_cpu_seconds / 3600),
        _pct(_efficiency(r, "memory_efficiency")),
        _pct(_efficiency(r, "cpu_efficiency")),
        str(r.engine_conns),
        _num(r.engine_conn_seconds / 3600),
    ]
    if wide:
        other = ",".join(f"{d}={v:g}" for d, v in sorted(granted.items())) or "-"
        cells += [
            str(r.engine_conns_failed), str(r.demands_planned), str(r.demands_allocated),
            str(r.demands_failed), other,
        ]  # fmt: skip
    return cells


def _csv_cells(r: usage_pb2.UsageRow) -> list[Any]:
    mem, cpu = _efficiency(r, "memory_efficiency"), _efficiency(r, "cpu_efficiency")
    return [
        r.tickets, r.granted.get("memory_bytes", 0.0), r.granted.get("cpu_millis", 0.0),
        r.measured_memory_byte_seconds, r.measured_cpu_seconds,
        r.measured_granted_memory_byte_seconds, r.measured_granted_cpu_core_seconds,
        "" if mem is None else mem, "" if cpu is None else cpu, r.engine_conns,
        r.engine_conns_failed, r.engine_conn_seconds, r.demands_planned,
        r.demands_allocated, r.demands_failed,
    ]  # fmt: skip
