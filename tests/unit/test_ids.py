"""Ids the RM makes: unique, of a fixed shape, and in the order they were made (so a
table keyed by them grows at the right edge of its index)."""

from __future__ import annotations

import re

from rm_server.clock import random_ids


def test_ids_have_the_prefix_and_32_hex_digits():
    assert re.fullmatch(r"t-[0-9a-f]{32}", random_ids("t"))
    assert re.fullmatch(r"ec-[0-9a-f]{32}", random_ids("ec"))


def test_ids_are_unique_and_sort_in_the_order_they_were_made():
    ids = [random_ids("t") for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    # Within one millisecond the order is random; across milliseconds it is the order made.
    stamps = [i[2:14] for i in ids]
    assert stamps == sorted(stamps)
