"""Token files, bearer headers and certificate identities."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from labelrm_common import tokens
from labelrm_common.roles import Role
from rm_server.security.identity import (
    BadCredentials,
    Kind,
    bearer_token,
    from_auth_context,
    from_token_entry,
    peer_host,
)
from rm_server.security.tokens import TokenFile
from tests.support.messages import present


@pytest.mark.parametrize("name", ["tokens.toml", "tokens.json"])
def test_add_lookup_revoke(tmp_path, name):
    path = tmp_path / name
    alice = tokens.add_token(path, "alice", ["user"], "laptop")
    root = tokens.add_token(path, "root", ["admin", "user"])
    assert alice.startswith("lrm_") and alice != root
    text = path.read_text()
    assert alice not in text and root not in text  # only hashes are stored
    assert tokens.hash_token(alice) in text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    table = TokenFile(path)
    entry = table.lookup(alice)
    assert entry is not None and entry.user == "alice" and entry.roles == {Role.USER}
    assert entry.note == "laptop"
    assert present(table.lookup(root)).roles == {Role.ADMIN, Role.USER}
    assert table.lookup("lrm_guess") is None
    assert table.lookup("") is None and table.lookup("x" * 10_000) is None
    assert tokens.revoke(path, user="alice") == 1
    table.check_interval = 0
    os.utime(path, ns=(1, 1))  # a changed stamp even within one clock tick
    assert table.lookup(alice) is None  # reloaded without a restart
    assert table.lookup(root) is not None


def test_revoke_by_hash_prefix(tmp_path):
    path = tmp_path / "t.toml"
    token = tokens.add_token(path, "bob", ["user"])
    prefix = tokens.hash_token(token).removeprefix("sha256:")[:10]
    with pytest.raises(ValueError, match="at least 8"):
        tokens.revoke(path, prefix="abc")
    assert tokens.revoke(path, prefix=prefix) == 1
    assert len(TokenFile(path)) == 0


@pytest.mark.parametrize("damage", ["unparsable", "deleted", "group-writable"])
def test_a_broken_file_fails_closed(tmp_path, damage):
    path = tmp_path / "t.toml"
    token = tokens.add_token(path, "bob", ["user"])
    table = TokenFile(path, check_interval=0)
    key, _ = present(table.find(token))
    if damage == "unparsable":
        path.write_text("this is [ not toml")
    elif damage == "deleted":
        path.unlink()
    else:
        path.chmod(0o620)
    # No stale token stays valid: neither on a new call nor on an open stream's re-check.
    assert table.lookup(token) is None
    assert table.current(key) is None
    with pytest.raises(tokens.TokenFileError):
        TokenFile(path)  # at start-up a broken file stops the RM


@pytest.mark.parametrize("mode", [0o602, 0o620, 0o666])
def test_a_token_file_others_can_write_is_refused_at_start(tmp_path, mode):
    path = tmp_path / "t.toml"
    tokens.add_token(path, "bob", ["user"])
    path.chmod(mode)
    with pytest.raises(tokens.TokenFileError, match="writable by group or others"):
        TokenFile(path)
    path.chmod(0o640)  # readable by the group is fine: it holds hashes only
    assert len(TokenFile(path)) == 1


def test_a_token_file_of_another_user_is_refused_at_start(tmp_path):
    path = tmp_path / "t.toml"
    tokens.add_token(path, "bob", ["user"])
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)  # nobody's now
    else:
        path = Path("/etc/passwd")  # root's, and we are not root
    with pytest.raises(tokens.TokenFileError, match="not to the RM's user"):
        TokenFile(path)


@pytest.mark.parametrize(
    "content",
    [
        '[tokens."sha256:abc"]\nuser = "a"\n',  # not a sha256 hash
        f'[tokens."sha256:{"0" * 64}"]\nroles = ["user"]\n',  # no user
        f'[tokens."sha256:{"0" * 64}"]\nuser = "a"\nroles = ["root"]\n',  # unknown role
        f'[tokens."sha256:{"0" * 64}"]\nuser = "a"\nroles = ["engineconn"]\n',  # cert-only role
        "tokens = 3\n",
    ],
)
def test_invalid_entries_are_refused(tmp_path, content):
    path = tmp_path / "t.toml"
    path.write_text(content)
    with pytest.raises(tokens.TokenFileError):
        tokens.parse_tokens(path)


def test_token_cli_prints_the_token_once(tmp_path, capsys):
    path = tmp_path / "t.toml"
    assert tokens.main(["token", "add", "--file", str(path), "--user", "carol"]) == 0
    token = capsys.readouterr().out.splitlines()[0]
    assert present(TokenFile(path).lookup(token)).user == "carol"
    assert tokens.main(["token", "list", "--file", str(path)]) == 0
    listed = capsys.readouterr().out
    assert "carol" in listed and token not in listed
    assert tokens.main(["token", "revoke", "--file", str(path), "--user", "carol"]) == 0


def test_bearer_header():
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("Authorization", "bearer  abc ")]) == "abc"
    assert bearer_token([("authorization", "Basic abc")]) == ""
    assert bearer_token([("x-other", "1")]) is None
    assert bearer_token(None) is None


def test_identities_from_certificates():
    host_cert = {
        "x509_common_name": [b"host1"],
        "x509_subject_alternative_name": [b"host1.example", b"10.0.0.1"],
    }
    # Without a labelrm:// identity a certificate is nobody, unless the operator allows
    # named host certificates: then it is an agent known by its names.
    with pytest.raises(BadCredentials, match="allow_host_certificates"):
        from_auth_context(host_cert)
    agent = present(from_auth_context(host_cert, allow_host_certificates=True))
    assert agent.kind is Kind.AGENT and agent.roles == {Role.AGENT}
    assert agent.claims("host1") and agent.claims("host1.example") and not agent.claims("host2")
    ec = present(
        from_auth_context(
            {
                "x509_common_name": [b"ec-1"],
                "x509_subject_alternative_name": [b"labelrm://engineconn/ec-1"],
            }
        )
    )
    assert ec.kind is Kind.ENGINECONN and ec.name == "ec-1" and ec.roles == {Role.ENGINECONN}
    # The URI decides: an EngineConn certificate never passes for an agent, whatever its CN.
    assert not ec.claims("host1")
    user = present(from_auth_context({"x509_subject_alternative_name": [b"labelrm://user/alice"]}))
    assert user.kind is Kind.USER and user.roles == {Role.USER}
    assert from_auth_context({"transport_security_type": [b"ssl"]}) is None
    for bad in (
        [b"labelrm://server/localhost"],
        [b"labelrm://agent/a", b"labelrm://agent/b"],
        [b"labelrm://agent/"],
    ):
        with pytest.raises(BadCredentials):
            from_auth_context({"x509_subject_alternative_name": bad})


def test_token_principals():
    assert from_token_entry("a1", ["agent"]).kind is Kind.AGENT
    admin = from_token_entry("root", ["admin", "agent"])
    assert admin.kind is Kind.USER and admin.is_admin


def test_peer_host():
    assert peer_host("ipv4:10.0.0.5:51234") == "ipv4:10.0.0.5"
    assert peer_host("ipv6:[::1]:4444") == "ipv6:[::1]"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"
