"""The benchmark's storage ceiling runs the store's own SQL (bench/ceiling.py builds the
pgbench script from rm_server/store): it must keep up with the store's statements."""

from __future__ import annotations

import re

from bench.ceiling import CYCLE, cycle_script
from rm_server.store import tickets


def test_the_pgbench_script_is_built_from_the_store_sql():
    script = cycle_script()
    assert script.count("\\startpipeline") == script.count("\\endpipeline") == 6
    assert script.count("BEGIN;") == script.count("COMMIT;") == 3
    for sql in (tickets.READ, tickets.WRITE):
        head = " ".join(re.split(r"%\(\w+\)s", sql)[0].split())  # before the first parameter
        assert head in script
    # The checked-in script is what pgbench runs: a stale one measures old SQL.
    assert CYCLE.read_text() == script, (
        "bench/pgbench/cycle.sql is stale: run python -m bench.ceiling"
    )
