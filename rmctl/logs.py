"""`rmctl engineconn logs`: an EngineConn's stdout and stderr logs.

The RM keeps only the tail of a failed EngineConn's log. The full logs are files on the
agent's host, ``<work_dir>/logs/{stdout,stderr}.log``; `logs` reads them when that
directory is readable from here (dev mode, or rmctl run on the agent host as root or as
the EngineConn's user) and otherwise prints the stored tail and says where they are.
`--tail N` starts N lines from each file's end; `--since 10m` leaves out the lines stamped
earlier (the EngineConn runtime stamps its lines; see `_stamped_since`).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import re
import stat
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from labelrm_client import RMClient, Unavailable
from labelrm_client._engineconn import LIVE_EC_STATES
from rmctl.args import non_negative, parse_duration
from rmctl.format import terminal_text
from rmctl.resolve import resolve_engine_conn

__all__ = ["add_logs_command", "readable_log_dir"]

LOG_FILES = ("stdout.log", "stderr.log")
_FOLLOW_POLL = 0.25  # seconds between reads of the log files while following
_STATE_POLL = 1.0  # seconds between GetEngineConn calls while following
_TAIL_BLOCK = 64 * 1024  # bytes read at a time when looking for the last lines
# "2024-05-01 12:00:00,123 INFO ..." (Python's logging), "2024-05-01T12:00:00Z ...".
_STAMP_RE = re.compile(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})")


def add_logs_command(sub: Any) -> None:
    """Register ``rmctl engineconn logs`` on the engineconn sub-command parsers."""
    c = sub.add_parser("logs", help="print an EngineConn's stdout and stderr logs")
    c.add_argument("ec_id", metavar="ID", help="an EngineConn id, or a unique prefix")
    c.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until it ends (or Ctrl-C)"
    )
    c.add_argument(
        "--tail", type=non_negative, default=None, metavar="N",
        help="start N lines from the end of each log (default: all)",
    )  # fmt: skip
    c.add_argument(
        "--since", type=parse_duration, default=None, metavar="DURATION",
        help="only lines stamped within DURATION (30s, 10m, 2h)",
    )  # fmt: skip
    c.set_defaults(func=cmd_ec_logs)


def _open_log(path: Path) -> int | None:
    """An fd on `path` if it is a regular file we may read (never through a symlink, never
    blocking on a FIFO a user left there), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def readable_log_dir(ec: Any) -> Path | None:
    """``<work_dir>/logs`` when it exists on this host and we may read it, else None."""
    if not ec.work_dir:
        return None
    logs = Path(ec.work_dir) / "logs"
    if not logs.is_dir() or not os.access(logs, os.R_OK | os.X_OK):
        return None
    for name in LOG_FILES:  # a file that is not there yet (not started) is fine
        if (logs / name).exists() and not os.access(logs / name, os.R_OK):
            return None
    return logs


class _LogReader:
    """Reads what was appended to each log file since the last call; the first call
    starts `tail` lines from each file's end (all of it when None) and, with `since`,
    leaves out the lines stamped before that moment."""

    def __init__(
        self, logs: Path, out: TextIO, tail: int | None = None, since: datetime | None = None
    ) -> None:
        self.logs = logs
        self.out = out
        self.offsets: dict[str, int | None] = dict.fromkeys(LOG_FILES)
        self.decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in LOG_FILES}
        self.last: str | None = None
        self.tail = tail
        self.since = since

    def pump(self) -> None:
        """Print what each file gained, under a ``==> file <==`` header when the file
        changes (as `tail -f` of several files does)."""
        for name in LOG_FILES:
            fd = _open_log(self.logs / name)
            if fd is None:
                continue
            with contextlib.closing(os.fdopen(fd, "rb")) as fh:
                size = os.fstat(fd).st_size
                first = self.offsets[name] is None
                offset = _tail_offset(fh, size, self.tail) if first else self.offsets[name]
                if offset is None or size < offset:  # truncated or replaced: start over
                    offset = 0
                fh.seek(offset)
                data = fh.read()
            if not data:
                self.offsets[name] = offset
                continue
            self.offsets[name] = offset + len(data)
            text = self.decoders[name].decode(data)
            if first and self.since is not None:
                text = _stamped_since(text, self.since)
            # Control characters a log could use to rewrite an operator's terminal (ESC,
            # C1, ...) are written out on a terminal; tab, newline and carriage return pass.
            text = terminal_text(text, self.out)
            if not text:
                continue
            if name != self.last:
                print(f"==> {self.logs / name} <==", file=self.out)
                self.last = name
            self.out.write(text if text.endswith("\n") else text + "\n")
            self.out.flush()


def _tail_offset(fh: BinaryIO, size: int, lines: int | None) -> int:
    """Where the last `lines` lines of a file of `size` bytes start (0: all of it); read
    backwards a block at a time, so a long log costs what its tail does."""
    if lines is None:
        return 0
    if lines == 0:
        return size
    end = size
    found = 0
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        fh.seek(start)
        block = fh.read(end - start)
        # A final newline ends the last line; it does not start another one.
        stop = len(block) - 1 if end == size and block.endswith(b"\n") else len(block)
        at = stop
        while (at := block.rfind(b"\n", 0, at)) >= 0:
            found += 1
            if found == lines:
                return start + at + 1
        end = start
    return 0


def _stamped_since(text: str, since: datetime) -> str:
    """The lines of `text` stamped at or after `since` (a line that starts with an ISO
    8601 date and time, in this host's local time as the EngineConn runtime writes it);
    an unstamped line (a traceback, a continuation) goes with the stamped line above it,
    and those before the first stamp are left out."""
    keep = False
    out = []
    for line in text.splitlines(keepends=True):
        stamp = _STAMP_RE.match(line)
        if stamp is not None:
            try:
                when = datetime.fromisoformat(f"{stamp.group(1)}T{stamp.group(2)}")
            except ValueError:
                when = None
            if when is not None:
                keep = when.astimezone() >= since
        if keep:
            out.append(line)
    return "".join(out)


def _print_stored_tail(ec: Any, out: TextIO, tail: int | None) -> int:
    where = (
        f"on ECM {ec.ecm_instance or '?'} in {ec.work_dir}/logs (stdout.log, stderr.log, "
        "launcher.log)"
        if ec.work_dir
        else f"nowhere: EngineConn {ec.engine_conn_id} never got a work directory"
    )
    if not ec.log_tail.strip():
        raise ValueError(
            f"no logs of {ec.engine_conn_id} here: the RM keeps a tail only when an "
            f"EngineConn fails, and its log files are {where}, not readable from this host"
        )
    lines = terminal_text(ec.log_tail, out).splitlines(keepends=True)
    text = "".join(lines[len(lines) - tail :] if tail is not None else lines)
    if text:
        out.write(text if text.endswith("\n") else text + "\n")
    print(f"note: this is the tail the RM kept; the full logs are {where}", file=sys.stderr)
    return 0


def cmd_ec_logs(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl engineconn logs ID [-f] [--tail N] [--since DURATION]`."""
    ec = resolve_engine_conn(client, args.ec_id)
    logs = readable_log_dir(ec)
    if logs is None:
        return _print_stored_tail(ec, out, args.tail)
    since = datetime.now(UTC) - timedelta(seconds=args.since) if args.since else None
    reader = _LogReader(logs, out, args.tail, since)
    reader.pump()
    if not args.follow:
        return 0
    # No deadline: follow until the EngineConn ends or the operator presses Ctrl-C.
    next_check = time.monotonic() + _STATE_POLL
    try:
        while ec.state in LIVE_EC_STATES:
            time.sleep(_FOLLOW_POLL)
            reader.pump()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + _STATE_POLL
                with contextlib.suppress(Unavailable):  # an RM restart does not stop a follow
                    ec = client.get_engine_conn(ec.engine_conn_id)
        reader.pump()  # what it wrote while ending
    except KeyboardInterrupt:
        return 0
    return 0
