"""How rmctl reaches the RM, run as a user would: transport failures say what is wrong
and what to try (not gRPC's "failed to connect to all addresses"), an address without a
port is the RM's port (not gRPC's 443), and contexts in one file replace three exported
variables per shell."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.serving import free_port
from tests.cli import rmctl_run
from tests.integration.security_fixtures import Pki, SecureRM, make_pki, start_secure, stop_secure


@pytest.fixture(scope="module")
def keys(tmp_path_factory: Any) -> Pki:
    return make_pki(tmp_path_factory.mktemp("rmctl-pki"))


@pytest.fixture
async def srm(database_url: str, keys: Pki) -> AsyncIterator[SecureRM]:
    """An RM serving TLS (and tokens) on its listener."""
    rm = await start_secure(database_url, keys)
    try:
        yield rm
    finally:
        await stop_secure(rm)


def _at(target: str) -> Any:
    return SimpleNamespace(target=target)


async def _error(target: str, *extra: str, env: dict[str, str] | None = None) -> str:
    rc, out, err = await rmctl_run(_at(target), *extra, "node", "list", env=env)
    assert (rc, out) == (1, ""), err
    assert err.count("\n") == 1, err  # one line
    return err


async def test_plaintext_to_a_tls_rm_says_to_give_its_ca(srm: Any) -> None:
    err = await _error(srm.inner.target)
    assert err.startswith(f"error: UNAVAILABLE: the RM at {srm.inner.target} (from --rm) closed")
    assert "it probably requires TLS. Give its CA with --tls-ca FILE" in err
    assert "failed to connect to all addresses" not in err


async def test_tls_to_a_plaintext_rm_says_it_does_not_speak_tls(rm: Any, srm: Any) -> None:
    err = await _error(rm.target, "--tls-ca", srm.pki.ca)
    assert "the TLS handshake with" in err and "does not seem to speak TLS" in err
    assert "Drop --tls-ca (it came from --tls-ca)" in err


async def test_a_ca_that_did_not_issue_the_rm_certificate(srm: Any) -> None:
    rogue = srm.pki.path("rogue-agent1", "crt")  # issued by another CA: not a CA itself
    err = await _error(srm.inner.target, "--tls-ca", rogue)
    assert f"presented a certificate that {rogue} CA (--tls-ca) does not verify" in err


async def test_nothing_listening_asks_for_the_right_host_or_port() -> None:
    target = f"127.0.0.1:{free_port()}"
    err = await _error(target)
    assert err == (
        f"error: UNAVAILABLE: cannot reach the RM at {target} (from --rm): connection "
        "refused. Is rm-server running there, and did you specify the right host or port? "
        "(--rm HOST:PORT, $LABELRM_RM or a context (rmctl config get-contexts))\n"
    )
    err = await _error("nosuchhost.invalid:7100")
    assert err.startswith("error: UNAVAILABLE: cannot resolve the RM's host nosuchhost")


async def test_an_address_without_a_port_is_the_rm_port() -> None:
    """`--rm 127.0.0.1` dialled :443 (gRPC's default) and said nothing of it."""
    err = await _error("127.0.0.1")
    assert "cannot reach the RM at 127.0.0.1:7100 (from --rm)" in err
    rc, _, err = await rmctl_run(_at("http://rm.example:7100"), "node", "list")
    assert (rc, err) == (
        1,
        "error: the RM's address is HOST:PORT, not a URL: 'http://rm.example:7100' (try "
        "'rm.example:7100') (from --rm)\n",
    )
    rc, _, err = await rmctl_run(None, "node", "list", env={"LABELRM_RM": "127.0.0.1:99999"})
    assert (
        err
        == "error: the RM's address '127.0.0.1:99999' has no valid port (1-65535) (from $LABELRM_RM)\n"
    )


async def test_a_missing_ca_file_is_named_with_its_origin(tmp_path: Path) -> None:
    rc, _, err = await rmctl_run(
        None, "node", "list", env={"LABELRM_TLS_CA": str(tmp_path / "ca.crt")}
    )
    assert (rc, err) == (1, f"error: $LABELRM_TLS_CA {tmp_path / 'ca.crt'}: no such file\n")


async def test_contexts_replace_three_variables(srm: Any, rm: Any, tmp_path: Path) -> None:
    """set-context / use-context / get-contexts, and the precedence: flag, --context,
    environment, current context."""
    config = tmp_path / "conf" / "rmctl.toml"  # its directory is made too
    env = {"LABELRM_CONFIG": str(config)}
    token_file = tmp_path / "root.token"
    token_file.write_text(srm.pki.tokens["root"] + "\n")
    argv = ("config", "set-context", "prod", "--rm", srm.inner.target, "--tls-ca", srm.pki.ca,
            "--token-file", str(token_file))  # fmt: skip
    rc, out, err = await rmctl_run(None, *argv, env=env)
    assert (rc, out) == (0, f"context 'prod' (current) set in {config}\n"), err
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    rc, out, err = await rmctl_run(None, "config", "set-context", "dev", "--rm", rm.target, env=env)
    assert rc == 0, err
    rc, out, err = await rmctl_run(None, "config", "get-contexts", env=env)
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["CURRENT", "NAME", "RM", "TLS-CA", "AUTH"]
    assert rows[1] == ["dev", rm.target, "-", "-"]
    assert rows[2] == ["*", "prod", srm.inner.target, srm.pki.ca, "token-file", str(token_file)]

    # The current context (prod: TLS and a token) is used with no flag and no variable.
    rc, out, err = await rmctl_run(None, "node", "list", env=env)
    assert (rc, out.split()) == (
        0,
        ["INSTANCE", "STATE", "ISOLATION", "ENGINECONNS", "TOTAL", "LEFT", "LAST_HEARTBEAT"],
    ), err
    # A variable beats the current context; --context beats the variable.
    plain = {**env, "LABELRM_RM": rm.target, "LABELRM_TLS_CA": "", "LABELRM_TOKEN": ""}
    rc, out, err = await rmctl_run(None, "--context", "dev", "node", "list", env=env)
    assert rc == 0, err
    rc, out, err = await rmctl_run(None, "node", "list", env={**env, "LABELRM_RM": rm.target})
    assert rc == 1 and "the TLS handshake with" in err and "(from $LABELRM_RM)" in err
    rc, out, err = await rmctl_run(None, "--context", "prod", "node", "list", env=plain)
    assert rc == 0, err
    rc, out, err = await rmctl_run(None, "config", "use-context", "dev", env=env)
    assert (rc, out) == (0, f"switched to context 'dev' ({config})\n"), err
    rc, out, err = await rmctl_run(None, "node", "list", env=env)
    assert rc == 0, err
    rc, out, err = await rmctl_run(None, "config", "use-context", "prd", env=env)
    assert rc == 1 and "no context 'prd'" in err and "did you mean 'prod'?" in err
    rc, out, err = await rmctl_run(None, "--context", "nope", "node", "list", env=env)
    assert rc == 1 and "no context 'nope' (from --context)" in err


def test_the_config_file_path_follows_xdg(monkeypatch: Any, tmp_path: Path) -> None:
    from rmctl.config import config_path

    monkeypatch.delenv("LABELRM_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config_path() == tmp_path / "labelrm" / "rmctl.toml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config_path() == Path(os.path.expanduser("~/.config/labelrm/rmctl.toml"))
