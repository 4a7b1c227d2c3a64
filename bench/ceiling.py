"""The storage ceiling: pgbench running the store's own SQL on the same database.

The scripts in bench/pgbench/ repeat, statement for statement (and pipeline for
pipeline), what rm_server/store executes per Apply, ReportUsed and Release, with the
values the server would compute written as constants. They run in a schema of their
own (`pgbench`) whose tables are copies of the labelrm tables (same columns,
constraints and indexes) and whose label rows are copies of the benchmark's, so the
ceiling and the server work on identical data without disturbing each other.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import CpuMeter

SCRIPTS = Path(__file__).resolve().parent / "pgbench"
CYCLE = SCRIPTS / "cycle.sql"
SCHEMA = "pgbench"
# The first two hold what the cycle reads and are copied; the others start empty. `ecm`:
# the READ statement names the state of the ECM behind each label (a LOST ECM refuses).
TABLES = ("label_resource", "ecm", "ticket", "ticket_history", "request_log", "apply_waiter")


def prepare(url: str) -> None:
    """(Re)create the pgbench schema from the labelrm tables and copy the label rows."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        for table in TABLES:
            conn.execute(f"CREATE TABLE {SCHEMA}.{table} (LIKE public.{table} INCLUDING ALL)")
        for table in TABLES[:2]:
            conn.execute(f"INSERT INTO {SCHEMA}.{table} SELECT * FROM public.{table}")  # noqa: S608
            conn.execute(f"VACUUM ANALYZE {SCHEMA}.{table}")


def reset(url: str) -> None:
    """Empty the pgbench tables between runs (label rows back to zero use)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES[2:]:
            conn.execute(f"TRUNCATE {SCHEMA}.{table}")


def run(
    pgbench: str,
    url: str,
    script: Path,
    clients: int,
    seconds: float,
    defines: dict[str, Any],
    postgres_pids: Callable[[], list[int]],
) -> dict[str, Any]:
    """Run one pgbench script; returns scripts/s (= cycles/s), latency and CPU."""
    if not pgbench:
        return {"error": "pgbench not found (install postgresql-client)"}
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["options"] = f"-csearch_path={SCHEMA}"
    conninfo = make_conninfo("", **params)
    cmd = [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2))]
    cmd += ["-T", str(round(seconds)), "-f", str(script)]
    for k, v in defines.items():
        cmd += ["-D", f"{k}={v}"]
    cmd.append(conninfo)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # connections made: measure CPU from here until just before the end
    meter = CpuMeter({"pgbench": [proc.pid], "postgres": postgres_pids()})
    meter.start()
    time.sleep(max(0.5, round(seconds) - 1.5))
    cpu = meter.stop()
    out, err = proc.communicate(timeout=seconds + 60)
    if proc.returncode != 0:
        return {"error": (err or out)[-1500:]}
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    lat = re.search(r"latency average = ([0-9.]+) ms", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    return {
        "cycles_per_s": round(float(tps.group(1)), 1) if tps else 0.0,
        "cycle_latency_avg_ms": float(lat.group(1)) if lat else None,
        "failed": int(failed.group(1)) if failed else 0,
        "cpu": cpu,
    }


# ----- the script: the store's own statements, parameters as pgbench expressions ----------

ECM = "'emInstance=bench' || :e::text || ':9000'"
USER = "'userCreator=u' || :u::text || '-IDE,engineType=spark-3.2.1'"
# pgbench takes ":name" anywhere, inside a quoted literal too, for a variable: the
# caller "user:bench" is written so that no letter follows its colon.
CALLER = "'user:' || 'bench'"
TICKET = "'t-' || :client_id::text || '-' || :r::text"  # typed: pgbench -M prepared sends $n
T0 = "2026-01-01T00:00:00+00:00"
GIB = 1024**3
REQUEST = {"kind": "load", "cpu_millis": 100, "memory_bytes": GIB}
ZERO = {"kind": "load", "cpu_millis": 0, "memory_bytes": 0}
ECM_ZERO = {"kind": "load_instance", "cpu_millis": 0, "instances": 0, "memory_bytes": 0}
ECM_ONE = {"kind": "load_instance", "cpu_millis": 100, "instances": 0, "memory_bytes": GIB}
HASH = "\\x" + "5c" * 32  # a SHA-256 of the request, hex as the server sends it
RESPONSE = "\\x" + "0a" * 243  # an encoded response (243 bytes here)
LABELS = [["userCreator", "u1-IDE"], ["engineType", "spark-3.2.1"], ["emInstance", "bench1:9000"]]


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _json(value: Any, **subst: str) -> str:
    """A SQL expression for json.dumps(value), with "@NAME@" strings replaced by the
    SQL expressions in `subst` (concatenated in)."""
    import json
    import re

    pieces = re.split(r"@([A-Z]+)@", json.dumps(value))
    # pieces alternate: literal text, a name, literal text, ...
    parts = [_lit(p) if i % 2 == 0 else f"({subst[p]})" for i, p in enumerate(pieces)]
    return "(" + " || ".join(p for p in parts if p != "''") + ")"


def _fill(sql: str, **params: str) -> str:
    """`sql` with each named parameter, %(name)s, replaced by the SQL expression given."""
    import re

    placeholder = re.compile(r"%\((\w+)\)s")
    assert set(placeholder.findall(sql)) == set(params), (sql, params)
    out = placeholder.sub(lambda m: f"({params[m.group(1)]})", sql)
    return " ".join(out.split()) + ";"


def cycle_script() -> str:
    """Apply -> ReportUsed -> Release for one request each, as rm_server/store/tickets.py
    runs a group of one: per RPC, BEGIN + one read statement (taking the row locks),
    then one write statement + COMMIT: two pipelined round trips."""
    from rm_server.store import tickets as ticket_sql

    def log_entry(method: str) -> list[dict[str, Any]]:
        return [
            {
                "caller": "@C@",
                "method": method,
                "request_id": "@R@",
                "request_hash": HASH,
                "status_code": 0,
                "response": RESPONSE,
            }
        ]

    def labels(
        used: tuple[dict[str, Any], dict[str, Any]],
        locked: tuple[dict[str, Any], dict[str, Any]],
        live: int,
    ) -> str:
        rows = [
            {
                "label": "@E@",
                "used": used[0],
                "locked": locked[0],
                "kind": "load_instance",
                "live": live,
            },
            {"label": "@U@", "used": used[1], "locked": locked[1], "kind": "load", "live": live},
        ]
        return _json(rows, E=ECM, U=USER)

    ticket = {
        "ticket_id": "@T@", "state": "LOCKED", "user_name": "", "labels": LABELS, "charged_labels": ["@E@", "@U@"],
        "requested": REQUEST, "locked": REQUEST, "used": ZERO, "created_at": T0, "updated_at": T0, "lock_expires_at": T0,
    }  # fmt: skip
    reported = {
        "ticket_id": "@T@",
        "state": "USED",
        "used": REQUEST,
        "locked": ZERO,
        "lock_expires_at": None,
        "updated_at": T0,
    }
    history = {
        "ticket_id": "@T@", "final_state": "RELEASED", "reason": "released", "user_name": "", "labels": LABELS,
        "charged_labels": ["@E@", "@U@"], "requested": REQUEST, "used": REQUEST, "created_at": T0, "reported_at": T0, "ended_at": T0,
    }  # fmt: skip
    sub = {"T": TICKET, "E": ECM, "U": USER}
    rid = {
        m: f"'{tag}-' || :client_id::text || '-' || :r::text"
        for m, tag in (("Apply", "pa"), ("ReportUsed", "pu"), ("Release", "pr"))
    }

    def rpc(method: str, read: tuple[str, str], write: dict[str, str]) -> list[str]:
        apply_labels, tickets = read
        none = "'[]'"
        params = {
            "now": "now()",
            "labels": write.get("labels", none),
            "inserted": write.get("insert", none),
            "updated": write.get("update", none),
            "deleted": write.get("delete", "'{}'"),
            "history": write.get("history", none),
            "log": _json(log_entry(method), R=rid[method], C=CALLER),
            "waiters": "'{}'",
            "channel": "'labelrm_events'",
            "notify": write.get("notify", "'{}'"),
        }
        return [
            f"-- {method}",
            "\\startpipeline",
            "BEGIN;",
            _fill(
                ticket_sql.READ,
                callers=f"ARRAY[{CALLER}]",
                methods=f"ARRAY['{method}']",
                request_ids=f"ARRAY[{rid[method]}]",
                now="now()",
                apply_labels=apply_labels,
                ticket_ids=tickets,
            ),
            "\\endpipeline",
            "\\startpipeline",
            _fill(ticket_sql.WRITE, **params),
            "COMMIT;",
            "\\endpipeline",
        ]

    one = f"ARRAY[{TICKET}]"
    lines = [
        "-- Generated by `python -m bench.ceiling` from the SQL in rm_server/store/tickets.py:",
        "-- one Apply -> ReportUsed -> Release cycle, each RPC a transaction of",
        "-- two pipelined round trips exactly as the server runs a request on its own. The",
        "-- values the server computes are constants. -D emax=15: spread over 16 ECMs; 0: hot.",
        "\\set u random(0, 999)",
        "\\set e random(0, :emax)",
        "\\set r random(1, 9000000000000000000)",
    ]
    lines += rpc(
        "Apply",
        (f"ARRAY[{ECM}, {USER}]", "'{}'"),
        {
            "labels": labels((ECM_ZERO, ZERO), (ECM_ONE, REQUEST), 1),
            "insert": _json([ticket], **sub),
        },
    )
    lines += rpc(
        "ReportUsed",
        ("'{}'", one),
        {
            "labels": labels((ECM_ONE, REQUEST), (ECM_ZERO, ZERO), 1),
            "update": _json([reported], **sub),
        },
    )
    lines += rpc(
        "Release",
        ("'{}'", one),
        {
            "labels": labels((ECM_ZERO, ZERO), (ECM_ZERO, ZERO), 0),
            "delete": one,
            "history": _json([history], **sub),
            "notify": f"ARRAY[{ECM}, {USER}]",
        },
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    """Write bench/pgbench/cycle.sql from the store's SQL (run after changing it)."""
    CYCLE.write_text(cycle_script())
    print(f"wrote {CYCLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
