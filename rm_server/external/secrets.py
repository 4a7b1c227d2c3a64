"""Secrets the RM reads rather than stores: an external provider's password named by its
``password_secret``. The operator keeps it in a file of ``provider_secrets_dir`` (the
file of that name) or in the RM's environment (``LABELRM_PROVIDER_SECRET_<NAME>``, the
name upper-cased with '-' as '_'); the database holds only the name. Read at every
fetch, so replacing the file (or restarting with a new variable) rotates it.

A name is ``[a-z][a-z0-9_-]*`` (rm_server/domain/external.py): it cannot name a path
outside the directory, nor any environment variable but the prefixed ones (an admin
must not make the RM send its database URL or its keys to an address of their choice).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_PREFIX = "LABELRM_PROVIDER_SECRET_"
MAX_SECRET_BYTES = 64 * 1024


class SecretMissing(Exception):
    """The named secret is not where the RM looks (the message says where it looked)."""


def env_name(name: str) -> str:
    """The environment variable of secret `name` (``prod-yarn`` ->
    ``LABELRM_PROVIDER_SECRET_PROD_YARN``)."""
    return ENV_PREFIX + name.upper().replace("-", "_")


@dataclass(frozen=True)
class SecretSource:
    """Where this RM reads named secrets: `directory` first, then `environ`."""

    directory: str = ""
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def read(self, name: str) -> str:
        """The secret `name` (a trailing line break dropped), or SecretMissing."""
        looked = []
        if self.directory:
            path = Path(self.directory) / name
            looked.append(f"no file {path}")
            text = _read_file(path)
            if text == "":
                raise SecretMissing(f"secret {name!r}: {path} is empty")
            if text is not None:
                return text
        value = self.environ.get(env_name(name), "")
        if value:
            return value
        looked.append(f"no ${env_name(name)}")
        raise SecretMissing(f"secret {name!r}: {' and '.join(looked)} on this RM")


def _read_file(path: Path) -> str | None:
    """The file's text; None when there is no such file. A FIFO or a device cannot
    block the RM (opened non-blocking, refused unless a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretMissing(f"cannot read {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SecretMissing(f"{path} is not a regular file")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretMissing(f"{path} is larger than {MAX_SECRET_BYTES} bytes")
    try:
        return data.decode().rstrip("\r\n")
    except UnicodeDecodeError:
        raise SecretMissing(f"{path} is not UTF-8 text") from None
