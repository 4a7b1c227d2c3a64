"""docs/configuration.md lists every setting of both daemons, generated from their
definitions; rm-server and ecm-agent describe each in --help and fail on one line."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

from ecm_agent.settings import HELP, AgentSettings
from rm_server.config import RM_SERVER, Settings
from tests.support.env import ROOT

GENERATOR = ROOT / "scripts" / "gen_settings_doc.py"


def test_every_setting_has_a_description() -> None:
    RM_HELP = {spec.name: spec.meta.help for spec in RM_SERVER.specs}
    assert [f.name for f in fields(Settings) if not RM_HELP.get(f.name)] == []
    assert [f.name for f in fields(AgentSettings) if not HELP.get(f.name)] == []
    # ... and no description of a setting that is gone.
    assert set(RM_HELP) == {f.name for f in fields(Settings)}
    assert set(HELP) == {f.name for f in fields(AgentSettings)}


def test_configuration_md_is_generated_and_complete() -> None:
    """The generator is a script (`make docs`), not part of the server: run as one."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    done = _run(str(GENERATOR), "--check")
    assert done.returncode == 0, done.stderr  # "docs/configuration.md is stale: run `make docs`"
    tables = _run(str(GENERATOR)).stdout
    assert tables and tables.strip() in text
    for cls, env in ((Settings, "LABELRM_"), (AgentSettings, "LABELRM_AGENT_")):
        for f in fields(cls):
            assert f"| `{f.name}` |" in tables and f"`{env}{f.name.upper()}`" in text


def test_a_stale_configuration_md_is_caught(tmp_path) -> None:
    """--check fails on a file whose tables differ from the declarations."""
    copy = tmp_path / "scripts"
    copy.mkdir()
    (copy / GENERATOR.name).write_text(GENERATOR.read_text())
    (tmp_path / "docs").mkdir()
    stale = (
        (ROOT / "docs" / "configuration.md").read_text().replace("| `lock_timeout` |", "| `x` |")
    )
    (tmp_path / "docs" / "configuration.md").write_text(stale)
    done = _run(str(copy / GENERATOR.name), "--check")
    assert done.returncode == 1 and "run `make docs`" in done.stderr


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_rm_server_help_version_and_one_line_errors() -> None:
    done = _run("-m", "rm_server", "--help")
    assert done.returncode == 0
    assert "seconds a LOCKED ticket may stay unreported" in done.stdout
    assert "[LABELRM_LOCK_TIMEOUT]" in done.stdout
    done = _run("-m", "rm_server", "--version")
    assert done.returncode == 0 and done.stdout.startswith("rm-server ")
    for argv, expected in (
        (("--pool-max", "many"), "invalid value 'many' for pool_max (--pool-max)"),
        (("--no-such-flag",), "unrecognized arguments: --no-such-flag"),
        (("--config", "/nonexistent/rm.toml"), "cannot read config file /nonexistent/rm.toml"),
        (("--log-format", "xml"), "log_format must be one of text, json"),
    ):
        done = _run("-m", "rm_server", *argv, "--print-config")
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("rm-server: error: ") and expected in done.stderr
    done = _run("-m", "ecm_agent", "--no-such-flag")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
