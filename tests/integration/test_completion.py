"""rmctl's shell completion, run by a real bash on the script rmctl prints: commands,
options, values and ids, each TAB without loading grpc."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labelrm_client import AsyncRMClient, load, load_instance
from tests.support.env import ROOT
from tests.support.waiting import wait_until

BIN = Path(sys.executable).parent


def complete(
    shell: str, *words: str, cache: Path, prefix: str = "", pythonpath: str = ""
) -> list[str]:
    """COMPREPLY for the word `prefix` after the command line `words`."""
    line = " ".join(shlex.quote(w) for w in (*words, prefix))
    script = (
        f"source <(rmctl completion {shell}); COMP_WORDS=({line}); "
        f"COMP_CWORD={len(words)}; _rmctl_complete; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    if shell == "zsh":
        script = "emulate bash 2>/dev/null; " + script
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(cache), "XDG_CACHE_HOME": str(cache),
           "LABELRM_CONFIG": str(cache / "rmctl.toml"), "PYTHONPATH": pythonpath}  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_bash_completes_commands_options_and_values(tmp_path: Path) -> None:
    assert {"engineconn", "node", "get"} <= set(complete("bash", "rmctl", cache=tmp_path))
    assert complete("bash", "rmctl", "node", cache=tmp_path) == [
        "cordon", "decommission", "delete", "drain", "list", "refresh", "rm", "status", "uncordon"
    ]  # fmt: skip
    assert "idle" in complete("bash", "rmctl", "engineconn", "list", "--state", cache=tmp_path)
    assert complete("bash", "rmctl", "-o", cache=tmp_path) == [
        "table", "wide", "json", "yaml", "name"
    ]  # fmt: skip
    assert complete("bash", "rmctl", "get", prefix="no", cache=tmp_path) == ["no", "node", "nodes"]


def test_a_tab_does_not_load_grpc(tmp_path: Path) -> None:
    """Each TAB started the whole of rmctl (grpc, protobuf, every parser): 0.9 to 4.4 s
    under load. With the tree cached, a TAB needs none of it: here grpc cannot even be
    imported, and the commands still complete."""
    complete("bash", "rmctl", cache=tmp_path)  # builds and caches the tree
    broken = tmp_path / "no-grpc"
    (broken / "grpc").mkdir(parents=True)
    (broken / "grpc" / "__init__.py").write_text("raise ImportError('grpc loaded on a TAB')\n")
    got = complete("bash", "rmctl", "node", prefix="c", cache=tmp_path, pythonpath=str(broken))
    assert got == ["cordon"]
    got = complete("bash", "rmctl", "-o", prefix="j", cache=tmp_path, pythonpath=str(broken))
    assert got == ["json"]


async def test_ids_complete_from_the_rm(rm: Any, tmp_path: Path) -> None:
    """Completion listed no ids: it lists the nodes, tickets, ... of the RM the command
    line names (kept for a few seconds, then fetched again behind the next TAB)."""
    async with AsyncRMClient(rm.target, timeout=10.0) as client:
        for name in ("node-a", "node-b"):
            await client.register_ecm(name, load_instance(8 << 30, 4000, 8))
        await client.set_label_limit("userCreator=*,engineType=*", load(4 << 30, 4000))
        ticket = await client.apply("userCreator=alice-IDE,engineType=spark-3", load(1 << 30, 100))
    at = ("rmctl", "--rm", rm.target)

    async def completes(*words: str, prefix: str = "") -> list[str]:
        # A kind never fetched may take a TAB or two under load: its fetch goes on.
        found: list[str] = await wait_until(
            lambda: complete("bash", *at, *words, prefix=prefix, cache=tmp_path),
            30, what=f"ids after {words}", interval=0.2,
        )  # fmt: skip
        return found

    assert await completes("node", "status") == ["node-a", "node-b"]
    assert complete("bash", *at, "node", "drain", "node-b", cache=tmp_path) == []  # one NAME
    assert await completes("get", "nodes", prefix="node-") == ["node-a", "node-b"]
    assert await completes("describe", "node") == ["node-a", "node-b"]
    assert await completes("ticket", "release") == [ticket.ticket_id]
    assert await completes("limit", "rm") == ["userCreator=*,engineType=*"]


def test_contexts_complete(tmp_path: Path) -> None:
    (tmp_path / "rmctl.toml").write_text(
        '[contexts.prod]\nrm = "a:1"\n[contexts.dev]\nrm = "b:1"\n'
    )
    assert complete("bash", "rmctl", "config", "use-context", cache=tmp_path) == ["dev", "prod"]
    assert complete("bash", "rmctl", "--context", cache=tmp_path) == []  # a value, not ids


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_script_is_printed(shell: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rmctl", "completion", shell],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0 and "complete -o default -F _rmctl_complete rmctl" in done.stdout
    if shell == "zsh":
        assert "bashcompinit" in done.stdout
