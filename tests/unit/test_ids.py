"""Ids the RM makes: unique, of a fixed shape; tickets' in the order they were made (so the
ticket tables grow at the right edge of their index), the others' random from the first
digit (so a short prefix names one)."""

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


def test_ids_operators_type_by_prefix_differ_from_their_first_digits():
    ids = [random_ids("ec") for _ in range(2_000)]
    assert len({i[:10] for i in ids}) > 1_900  # 7 hex digits: collisions are rare
