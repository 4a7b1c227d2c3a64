"""Following an EngineConn's logs from the RM's host (console/logs.py): what was appended
since an offset, bounded; never through a symlink and never a file of another user
(the RM may read as root in a directory the EngineConn's user controls)."""

from __future__ import annotations

import os
from pathlib import Path

from rm_server.console.logs import read_new

ME = os.geteuid()


def _work_dir(tmp_path: Path) -> Path:
    work = tmp_path / "ec-1"
    (work / "logs").mkdir(parents=True)
    return work


def test_reads_what_was_appended_since_an_offset(tmp_path):
    work = _work_dir(tmp_path)
    log = work / "logs" / "stderr.log"
    log.write_text("one\n")
    first = read_new(str(work), ME, {})
    assert first is not None and first["stderr.log"] == {
        "from": 0,
        "to": 4,
        "size": 4,
        "text": "one\n",
    }
    with log.open("a") as fh:
        fh.write("two\n")
    again = read_new(str(work), ME, {"stderr.log": 4})
    assert again is not None and again["stderr.log"]["text"] == "two\n"
    assert again["stderr.log"]["to"] == 8
    log.write_text("new\n")  # replaced: shorter than the offset, read from the start
    replaced = read_new(str(work), ME, {"stderr.log": 8})
    assert replaced is not None and replaced["stderr.log"]["text"] == "new\n"


def test_reads_are_bounded_and_never_split_a_character(tmp_path):
    work = _work_dir(tmp_path)
    (work / "logs" / "stdout.log").write_bytes(b"x" * 10 + "é".encode())
    out = read_new(str(work), ME, {}, most=4)  # first read: the last bytes
    assert out is not None and out["stdout.log"]["from"] == 8
    cut = read_new(str(work), ME, {"stdout.log": 0}, most=11)  # "é" is 2 bytes: left out
    assert (
        cut is not None and cut["stdout.log"]["text"] == "x" * 10 and cut["stdout.log"]["to"] == 10
    )


def test_links_and_other_users_files_are_not_read(tmp_path):
    work = _work_dir(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    (work / "logs" / "stdout.log").symlink_to(secret)
    out = read_new(str(work), ME, {})
    assert out == {}  # the link is not followed
    linked = tmp_path / "elsewhere"
    linked.symlink_to(work)
    assert read_new(str(linked), ME, {}) is None  # nor a linked directory
    (work / "logs" / "stderr.log").write_text("mine")
    assert read_new(str(work), ME + 1, {}) is None  # not that user's directory
    if ME == 0:  # a file another user owns, in the user's directory: not read
        theirs = work / "logs" / "launcher.log"
        theirs.write_text("theirs")
        os.chown(theirs, 65534, -1)
        out = read_new(str(work), ME, {})
        assert out is not None and set(out) == {"stderr.log"}
    assert read_new("relative/path", ME, {}) is None
    assert read_new(str(tmp_path / "missing"), ME, {}) is None
