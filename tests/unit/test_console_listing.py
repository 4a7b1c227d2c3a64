"""Paging a list (console/listing.py) and the running sums of a label's held resources
(app/listings.series), without I/O: a page holds the rows that match every word of the
filter, in the asked order, missing values last; the pages of a list cover each matching
row once; a cut snapshot says so; bad parameters are refused naming the parameter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rm_server.app.listings import series
from rm_server.console.listing import Snapshot, page, page_query
from rm_server.console.views import Row
from rm_server.errors import InvalidArgument

SORTS = {"id": lambda r: r["id"], "n": lambda r: r["n"]}
WORDS = ["alpha", "beta", "used", "locked", "x"]

rows_st = st.lists(
    st.tuples(st.integers(0, 5) | st.none(), st.lists(st.sampled_from(WORDS), max_size=3)),
    max_size=40,
)


def _snap(items) -> Snapshot:
    rows = tuple(
        Row({"id": f"r{i:03d}", "n": n}, " ".join([f"r{i:03d}", *words]))
        for i, (n, words) in enumerate(items)
    )
    return Snapshot(rows, len(rows) + 1, {"A": 1})


@given(items=rows_st, q=st.sampled_from(["", "alpha", "alpha beta", "USED"]),
       sort=st.sampled_from(["id", "-id", "n", "-n"]), limit=st.integers(1, 7))  # fmt: skip
def test_pages_cover_the_matching_rows_once_in_order(items, q, sort, limit):
    snap = _snap(items)
    want = [r for r in snap.rows if all(w in r.text for w in q.lower().split())]
    seen = []
    offset = 0
    while True:
        query = page_query(
            {"q": q, "sort": sort, "offset": str(offset), "limit": str(limit)}, SORTS, "id"
        )
        out = page(snap, query, SORTS)
        assert out["matched"] == len(want) and out["kept"] == len(snap.rows)
        assert out["cut"] is True and out["selected"] == len(snap.rows) + 1
        seen += out["rows"]
        offset += limit
        if offset >= out["matched"]:
            break
    assert sorted(r["id"] for r in seen) == sorted(r.json["id"] for r in want)
    key = sort.lstrip("-")
    values = [r[key] for r in seen]
    present = [v for v in values if v is not None]
    assert values == present + [None] * (len(values) - len(present))  # missing last
    assert present == sorted(present, reverse=sort.startswith("-"))


def test_bad_parameters_are_refused_by_name():
    for params, name in (
        ({"sort": "secret"}, "sort"),
        ({"limit": "0"}, "limit"),
        ({"limit": "10000"}, "limit"),
        ({"offset": "-1"}, "offset"),
        ({"offset": "two"}, "offset"),
        ({"q": "x" * 201}, "q"),
    ):
        with pytest.raises(InvalidArgument) as err:
            page_query(params, SORTS, "id")
        assert err.value.field == name


changes_st = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["memory_bytes", "cpu_millis"]),
              st.integers(-2, 12), st.integers(0, 100)),
    max_size=30,
)  # fmt: skip


@given(starts=changes_st, samples=st.integers(1, 10))
def test_series_are_the_running_sums_of_the_changes(starts, samples):
    # Every start is matched by an end later on (or none): a well-formed history.
    deltas = []
    for label, dim, at, amount in starts:
        deltas.append((label, dim, at, amount))
        deltas.append((label, dim, at + 3, -amount))
    out = series(deltas, samples)
    for label, per_dim in out.items():
        for dim, values in per_dim.items():
            assert len(values) == samples
            for i, v in enumerate(values):
                want = sum(
                    c for lb, d, at, c in deltas if lb == label and d == dim and 0 <= at <= i
                )
                assert v == max(0, want)
