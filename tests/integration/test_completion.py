"""rmctl's shell completion, run by a real bash on the script rmctl prints."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

BIN = Path(sys.executable).parent


def complete(shell: str, *words: str) -> list[str]:
    """COMPREPLY for the word after the command line `words`."""
    line = " ".join(shlex.quote(w) for w in words)
    script = (
        f"source <(rmctl completion {shell}); COMP_WORDS=({line} ''); "
        f"COMP_CWORD={len(words)}; _rmctl_complete; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    if shell == "zsh":
        script = "emulate bash 2>/dev/null; " + script
    done = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_bash_completes_commands_options_and_values() -> None:
    assert "engineconn" in complete("bash", "rmctl") and "node" in complete("bash", "rmctl")
    assert complete("bash", "rmctl", "node") == [
        "cordon", "decommission", "delete", "drain", "list", "refresh", "rm", "status", "uncordon"
    ]  # fmt: skip
    assert "idle" in complete("bash", "rmctl", "engineconn", "list", "--state")
    assert complete("bash", "rmctl", "-o") == ["table", "wide", "json", "yaml", "name"]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_script_is_printed(shell: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rmctl", "completion", shell],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0 and "complete -o default -F _rmctl_complete rmctl" in done.stdout
    if shell == "zsh":
        assert "bashcompinit" in done.stdout
