"""rmctl without the server: `pki` and `token` work on local files with rm_server not
importable, and `dev` runs the installed rm-server program (or says it is missing)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from rmctl import dev as rmctl_dev
from rmctl import main
from tests.support.env import ROOT


def test_pki_and_token_run_without_the_server_installed(tmp_path):
    # `sys.modules[name] = None` makes every import of rm_server fail, as on a host where
    # only the CLI is installed.
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["rm_server"] = None
        from rmctl import main
        assert main(["pki", "dev", "--dir", {str(tmp_path / "pki")!r}, "--agent-id", "a1"]) == 0
        assert main(["token", "add", "--file", {str(tmp_path / "t.toml")!r}, "--user", "u"]) == 0
        assert main(["token", "list", "--file", {str(tmp_path / "t.toml")!r}]) == 0
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pki" / "agent-a1.crt").exists()
    assert "token for u added" in done.stdout


def _no_rm_server(monkeypatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(empty))
    monkeypatch.setenv("PATH", str(empty))


def test_dev_without_rm_server_is_one_line_and_exit_127(monkeypatch, tmp_path, capsys):
    _no_rm_server(monkeypatch, tmp_path)
    assert main(["dev", "--data-dir", str(tmp_path / "data")]) == rmctl_dev.NOT_INSTALLED == 127
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "rm-server" in err and "not installed" in err


class _Exec(Exception):
    pass


def test_dev_execs_the_installed_rm_server_with_the_same_arguments(monkeypatch, tmp_path):
    _no_rm_server(monkeypatch, tmp_path)
    on_path = tmp_path / "bin"
    on_path.mkdir()
    program = on_path / "rm-server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(on_path))
    calls: list[tuple[str, list[str]]] = []

    def fake_execv(path: str, argv: list[str]) -> None:
        calls.append((path, argv))
        raise _Exec

    monkeypatch.setattr(os, "execv", fake_execv)
    with pytest.raises(_Exec):
        main(["--rm", "h:1", "dev", "--data-dir", "d", "--listen", "127.0.0.1:0"])
    assert calls == [
        (str(program), ["rm-server", "--dev", "--data-dir", "d", "--listen", "127.0.0.1:0"])
    ]


def test_dev_prefers_the_rm_server_beside_rmctl(monkeypatch, tmp_path):
    beside = tmp_path / "scripts"
    beside.mkdir()
    program = beside / "rm-server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(beside))
    assert rmctl_dev.find_rm_server() == str(program)


def _rmctl(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmctl", *argv], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env={**os.environ, "LABELRM_CONFIG": os.devnull},
    )  # fmt: skip


def test_pki_and_token_errors_say_what_to_do_on_stderr(tmp_path: Path) -> None:
    """They were Python's (`[Errno 2] ... ca.crt`, a temporary file's name for a missing
    directory), on stdout."""
    pki_dir = tmp_path / "pki"
    done = _rmctl("pki", "issue", "--dir", str(pki_dir), "server", "rm1")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"error: no CA in {pki_dir} (ca.crt and ca.key missing): run "
        f"`rmctl pki init --dir {pki_dir}` first\n"
    )
    file = tmp_path / "missing" / "tokens.toml"
    done = _rmctl("token", "add", "--file", str(file), "--user", "u")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"error: {file.parent}: no such directory (create it first)\n"


def test_pki_issue_refuses_to_overwrite_a_certificate(tmp_path: Path) -> None:
    """Re-issuing without --ip silently dropped the IP name, and clients that verify the RM
    by it stopped trusting it: refused without --force, naming what the old one names."""
    d = str(tmp_path)
    assert _rmctl("pki", "init", "--dir", d).returncode == 0
    first = _rmctl("pki", "issue", "--dir", d, "server", "rm1", "--dns", "rm1", "--ip", "10.0.0.5")
    assert first.returncode == 0, first.stderr
    before = (tmp_path / "server-rm1.crt").read_bytes()
    again = _rmctl("pki", "issue", "--dir", d, "server", "rm1", "--dns", "rm1")
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == (
        f"error: {tmp_path / 'server-rm1.crt'} exists (it names labelrm://server/rm1, --dns "
        "rm1, --ip 10.0.0.5): use --force to replace it, with the same --dns / --ip if "
        "clients still reach it by those\n"
    )
    assert (tmp_path / "server-rm1.crt").read_bytes() == before
    forced = _rmctl("pki", "issue", "--dir", d, "server", "rm1", "--dns", "rm1", "--force")
    assert forced.returncode == 0 and (tmp_path / "server-rm1.crt").read_bytes() != before
