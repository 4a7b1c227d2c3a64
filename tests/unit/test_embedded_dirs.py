"""Root's directories for what the embedded database's user cannot reach elsewhere:
made searchable by everyone whatever the umask, and refused when someone else could
write them; the owner file of a data directory's home, and when that data directory
counts as deleted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rm_server.relocated import (
    EmbeddedDatabaseError,
    Existence,
    Owner,
    data_dir_key,
    make_root_dir,
)
from tests.support.env import unavailable


@pytest.fixture(autouse=True)
def as_root() -> None:
    if os.geteuid() != 0:
        unavailable("root's directories: these tests run as root")


def test_made_0755_whatever_the_umask(tmp_path):
    target = tmp_path / "labelrm" / "embedded"
    old = os.umask(0o077)
    try:
        make_root_dir(target)
    finally:
        os.umask(old)
    for path in (target, target.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o755, path


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o700, 0o1777])
def test_an_existing_one_others_could_write_or_not_search_is_refused(tmp_path, mode):
    target = tmp_path / "labelrm"
    target.mkdir()
    target.chmod(mode)
    with pytest.raises(EmbeddedDatabaseError, match="only root can write"):
        make_root_dir(target)
    assert stat.S_IMODE(target.stat().st_mode) == mode  # checked, never changed


def test_a_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(EmbeddedDatabaseError):
        make_root_dir(tmp_path / "link")


def test_keys_are_short_and_distinct():
    keys = {data_dir_key(Path(f"/root/labelrm{i}/labelrm-data")) for i in range(1000)}
    assert len(keys) == 1000 and {len(k) for k in keys} == {32}


@given(
    path=st.text(
        st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="\x85"),
        min_size=1,
    ).map(lambda s: Path("/") / s.strip("/")),
    device=st.integers(-1, 2**64),
    handle_type=st.integers(-1, 2**31 - 1),
    handle=st.binary(max_size=128),
    rm_pid=st.integers(0, 2**22),
    rm_started=st.floats(0, 2e9, allow_nan=False),
)
def test_the_owner_file_says_what_was_written(
    path: Path, device: int, handle_type: int, handle: bytes, rm_pid: int, rm_started: float
) -> None:
    owner = Owner(path, device, handle_type, handle, rm_pid, rm_started)
    assert Owner.parse(owner.render()) == owner
    assert owner.render().splitlines()[0] == str(path)  # the path first, for operators


def test_an_older_owner_file_names_the_path_only_and_proves_nothing(tmp_path):
    owner = Owner.parse(f"{tmp_path}\n")
    assert owner == Owner(tmp_path) and not owner.rm_running()
    assert owner.existence() == (Existence.UNKNOWN, None)


def test_a_data_directory_is_deleted_only_once_it_is_gone_for_good(tmp_path):
    """Its handle follows it through a rename, and is stale once it is deleted: also
    while a process still has it open, and when another directory takes its path."""
    data = tmp_path / "data"
    data.mkdir()
    owner = Owner.of(data)
    if not owner.handle:
        unavailable(f"no file handles on the file system of {tmp_path}")
    assert owner.existence() == (Existence.LIVE, data)
    assert owner.rm_running()  # this process wrote it
    moved = data.rename(tmp_path / "moved")
    assert owner.existence() == (Existence.LIVE, moved)
    held = os.open(moved, os.O_RDONLY)
    try:
        moved.rmdir()
        assert owner.existence() == (Existence.DELETED, None)
    finally:
        os.close(held)
    data.mkdir()  # made again at the same path: another directory
    assert owner.existence() == (Existence.DELETED, None)
