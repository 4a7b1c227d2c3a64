"""Bearer tokens on calls: the RM looks each token up in its token file.

The file (the SHA-256 of each token -> its user and roles) and the tools that write it
(`rmctl token`) are labelrm_common/tokens.py. The RM re-reads the file when it changes
(its stat is looked at on every call: a revoked token is refused from the next call on),
so adding and revoking tokens needs no restart; open streams re-check their token on
every message. The file must belong to the RM's user and be writable by nobody else (the
RM refuses to start otherwise). A file that is deleted, no longer parses or becomes
unsafe fails closed: no token is valid until it is fixed (and the error is logged).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

from labelrm_common.tokens import TokenEntry, TokenFileError, hash_token, parse_tokens

log = logging.getLogger(__name__)

MAX_TOKEN_CHARS = 512  # anything longer is not ours: refused before hashing


def check_file_safety(path: Path) -> None:
    """TokenFileError unless `path` is a regular file owned by this process's user and
    writable by nobody else: whoever can write the file can make themselves an admin."""
    try:
        st = path.stat()
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise TokenFileError(f"token file {path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise TokenFileError(
            f"token file {path} belongs to uid {st.st_uid}, not to the RM's user"
            f" (uid {os.geteuid()}): chown it"
        )
    if st.st_mode & 0o022:
        raise TokenFileError(
            f"token file {path} is writable by group or others (mode"
            f" {stat.S_IMODE(st.st_mode):04o}): chmod 600 it"
        )


class TokenFile:
    """Looks tokens up in a token file, re-reading it when it changes.

    Fails closed: a file that disappears, stops parsing or becomes writable by others
    leaves no token valid until it is fixed (certificates keep working), rather than
    keeping a table that may hold tokens the operator meant to revoke."""

    def __init__(self, path: Path, check_interval: float = 0.0) -> None:
        self.path = path
        self.check_interval = check_interval
        check_file_safety(path)  # an unsafe or bad file at start-up stops the RM
        self._entries = parse_tokens(path)
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()

    def _file_stamp(self) -> tuple[int, ...]:
        try:
            st = self.path.stat()
        except OSError:
            return (0, 0, 0, 0, 0)
        return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid)

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._checked < self.check_interval and not force:
            return
        self._checked = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            check_file_safety(self.path)
            self._entries = parse_tokens(self.path)
        except TokenFileError as exc:
            self._entries = {}
            log.error("token file unusable, no token is valid until it is fixed: %s", exc)
            return
        log.info("token file %s reloaded: %d tokens", self.path, len(self._entries))

    def find(self, token: str) -> tuple[str, TokenEntry] | None:
        """(hash, entry) of a valid token, None otherwise."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        self._refresh()
        # The table is keyed by the SHA-256 of the token: a lookup compares digests,
        # so its timing tells nothing useful about the token itself.
        key = hash_token(token)
        entry = self._entries.get(key)
        return None if entry is None else (key, entry)

    def lookup(self, token: str) -> TokenEntry | None:
        """The entry of a valid token, None otherwise."""
        found = self.find(token)
        return None if found is None else found[1]

    def current(self, key: str) -> TokenEntry | None:
        """The entry now in force for the token hashed to `key` (the file re-read if it
        changed; always looked at, not once a second: a revocation must stop the very
        next message of an open stream, which may carry secrets): how an open stream
        re-checks the token it was opened with."""
        self._refresh(force=True)
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)
