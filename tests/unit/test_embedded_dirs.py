"""Root's directories for what the embedded database's user cannot reach elsewhere:
made searchable by everyone whatever the umask, and refused when someone else could
write them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rm_server.embedded import EmbeddedDatabaseError, data_dir_key, make_root_dir
from tests.helpers import unavailable


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
