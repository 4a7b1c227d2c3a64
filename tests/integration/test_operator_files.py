"""rmctl's local file commands (`token`, `pki`) as an operator runs them: as root, on files
a service user must keep reading, with the file names the shipped configuration expects."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

from labelrm_common.tokens import parse_tokens
from tests.support.env import ROOT, shared_tmp


def rmctl(*argv: str) -> subprocess.CompletedProcess[str]:
    """rmctl as a real process (local commands need no RM)."""
    return subprocess.run(
        [sys.executable, "-m", "rmctl", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def read_as(user: str, path: Path) -> subprocess.CompletedProcess[str]:
    """`path` read by `user` (as the RM's service user reads its token file)."""
    return subprocess.run(
        ["sudo", "-n", "-u", user, "cat", str(path)], capture_output=True, text=True, timeout=60
    )


def test_token_edits_keep_the_owner_group_and_mode(sudo_users: tuple[str, ...]) -> None:
    """A token file owned by the RM's service user stays its own, with its mode, across
    `rmctl token add` and `revoke` run as root; the service user reads every version."""
    service = pwd.getpwnam(sudo_users[0])
    home = shared_tmp("lrm-tokens-")
    try:
        path = home / "tokens.toml"
        path.write_text("")
        os.chown(path, service.pw_uid, service.pw_gid)
        path.chmod(0o640)
        before = os.stat(path)
        for argv in (
            ("token", "add", "--file", str(path), "--user", "alice"),
            ("token", "add", "--file", str(path), "--user", "bob", "--role", "admin"),
            ("token", "revoke", "--file", str(path), "--user", "alice"),
        ):
            done = rmctl(*argv)
            assert done.returncode == 0, done.stdout + done.stderr
            after = os.stat(path)
            assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid), argv
            assert stat.S_IMODE(after.st_mode) == 0o640, argv
            seen = read_as(service.pw_name, path)
            assert seen.returncode == 0, seen.stderr
            assert seen.stdout == path.read_text()
        seen_file = home / "seen.toml"
        seen_file.write_text(seen.stdout)
        users = sorted(e.user for e in parse_tokens(seen_file).values())
        assert users == ["bob"]  # alice's token is gone for the service user too
        assert not [p for p in home.iterdir() if p.name.endswith(".tmp")]
        # A new file: 0600, whatever the umask.
        fresh = home / "new.toml"
        assert rmctl("token", "add", "--file", str(fresh), "--user", "carol").returncode == 0
        assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o600
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _deploy_tls_files() -> set[str]:
    """The certificate and key file names the shipped configuration files refer to."""
    names = set()
    for config in ("rm-server.toml", "ecm-agent.toml"):
        settings = tomllib.loads((ROOT / "deploy" / config).read_text())
        names |= {
            Path(value).name
            for key, value in settings.items()
            if key.startswith("tls_") and isinstance(value, str) and value
        }
    return names


def test_pki_issue_writes_the_files_the_deploy_configs_name(
    sudo_users: tuple[str, ...], tmp_path: Path
) -> None:
    """The commands of docs/security.md produce exactly the files deploy/*.toml expect, and
    re-issuing a key the RM's user owns keeps it that user's."""
    tls = tmp_path / "tls"
    docs = (ROOT / "docs" / "security.md").read_text()
    commands = [
        line.split("#")[0].split()[2:]
        for line in docs.splitlines()
        if line.startswith("rmctl pki ") and " dev " not in line and " user " not in line
    ]
    assert [c[:1] for c in commands] == [["init"], ["issue"], ["issue"]]
    for argv in commands:
        argv = [str(tls) if a == "/etc/labelrm/tls" else a for a in argv]
        done = rmctl("pki", *argv)
        assert done.returncode == 0, done.stdout + done.stderr
    written = {p.name for p in tls.iterdir()}
    assert _deploy_tls_files() <= written, (_deploy_tls_files(), written)

    service = pwd.getpwnam(sudo_users[0])
    key = tls / "server-rm1.key"
    os.chown(key, service.pw_uid, service.pw_gid)
    done = rmctl(
        "pki", "issue", "--dir", str(tls), "server", "rm1", "--dns", "rm1.example", "--force"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    after = os.stat(key)
    assert (after.st_uid, stat.S_IMODE(after.st_mode)) == (service.pw_uid, 0o600)
