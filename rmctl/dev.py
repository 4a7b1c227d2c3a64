"""`rmctl dev`: start rm-server in dev mode (the embedded database plus one local agent).

rmctl never imports the server: hosts that only run the CLI (or an agent) do not have it
installed. `rmctl dev ARGS` therefore replaces itself with the installed ``rm-server
--dev ARGS`` program, whose output, signals and exit code are then rm-server's own.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

RM_SERVER = "rm-server"
# The shell's code for "command not found": rm-server is not installed.
NOT_INSTALLED = 127


def find_rm_server() -> str | None:
    """The rm-server program to run: the one installed beside this rmctl (the same
    environment, so the same version), else the first on PATH; None when there is none."""
    beside = Path(sysconfig.get_path("scripts")) / RM_SERVER
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(RM_SERVER)


def exec_rm_server_dev(args: Sequence[str]) -> int:
    """Replace this process with ``rm-server --dev ARGS``; does not return unless
    rm-server is missing (one line on stderr, exit code NOT_INSTALLED)."""
    program = find_rm_server()
    if program is None:
        print(
            f"error: `rmctl dev` runs {RM_SERVER}, which is not installed here"
            " (install the labelrm package with the server, or put rm-server on PATH)",
            file=sys.stderr,
        )
        return NOT_INSTALLED
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(program, [RM_SERVER, "--dev", *args])
    raise AssertionError("os.execv returned")  # pragma: no cover: execv never returns
