"""The PKI helper and the start-up refusals of unsafe set-ups."""

from __future__ import annotations

import stat
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography import x509

from labelrm_common import pki
from rm_server.config import Settings, load_config
from rm_server.security.ec_certs import EngineConnIssuer
from rm_server.security.setup import SecurityConfigError, build_security, is_loopback
from tests.support.messages import present


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    pki.dev_pki(directory, "agent1", days=1)
    return directory


def test_issued_certificates_name_kind_and_identity(ca_dir):
    ca = pki.load_ca(ca_dir)
    issued = pki.issue(ca, "agent", "host1:9000", valid_for=timedelta(hours=1))
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    assert cert.subject.rfc4514_string() == "CN=host1:9000"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [
        "labelrm://agent/host1:9000"
    ]
    assert cert.issuer == x509.load_pem_x509_certificate(ca.cert_pem).subject
    assert stat.S_IMODE((ca_dir / "ca.key").stat().st_mode) == 0o600
    with pytest.raises(ValueError):
        pki.issue(ca, "agent", "bad name")
    with pytest.raises(ValueError):
        pki.issue(ca, "wizard", "x")


def test_pki_cli(tmp_path, capsys):
    assert pki.main(["pki", "init", "--dir", str(tmp_path)]) == 0
    assert pki.main(["pki", "init", "--dir", str(tmp_path)]) == 1  # never overwrites silently
    assert pki.main(["pki", "issue", "--dir", str(tmp_path), "user", "alice"]) == 0
    assert (tmp_path / "user-alice.crt").exists() and (tmp_path / "user-alice.key").exists()


def test_engineconn_issuer_material(ca_dir):
    ca = pki.load_ca(ca_dir)
    creds = EngineConnIssuer(ca, ca.cert_pem, timedelta(hours=2)).issue("ec-42")
    names = [name for name, _, _ in creds.files]
    assert sorted(creds.environment) == ["LABELRM_TLS_CA", "LABELRM_TLS_CERT", "LABELRM_TLS_KEY"]
    assert set(creds.environment.values()) == set(names)
    cert = x509.load_pem_x509_certificate(
        dict((n, c) for n, c, _ in creds.files)[creds.environment["LABELRM_TLS_CERT"]]
    )
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= timedelta(hours=2, minutes=6)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [
        "labelrm://engineconn/ec-42"
    ]


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:7100", True),
        ("127.1.2.3:1", True),
        ("localhost:7100", True),
        ("[::1]:7100", True),
        ("0.0.0.0:7100", False),
        ("[::]:7100", False),
        ("10.1.2.3:7100", False),
        ("rm.example:7100", False),
    ],
)
def test_is_loopback(address, loopback):
    assert is_loopback(address) is loopback


def test_dev_mode_is_loopback_only(tmp_path):
    assert not build_security(Settings()).auth_enabled
    with pytest.raises(SecurityConfigError, match="authentication off"):
        build_security(Settings(listen="0.0.0.0:7100"))
    with pytest.raises(SecurityConfigError, match="authentication off"):
        build_security(Settings(listen="0.0.0.0:7100", insecure=True))


def test_non_loopback_needs_tls_or_insecure(tmp_path):
    token_file = tmp_path / "t.toml"
    token_file.write_text("")
    with pytest.raises(SecurityConfigError, match="without TLS"):
        build_security(Settings(listen="0.0.0.0:7100", token_file=str(token_file)))
    sec = build_security(Settings(listen="0.0.0.0:7100", token_file=str(token_file), insecure=True))
    assert sec.auth_enabled and "PLAINTEXT" in sec.describe()


def test_tls_settings_are_checked(ca_dir):
    cert, key = str(ca_dir / "server.crt"), str(ca_dir / "server.key")
    ca, ca_key = str(ca_dir / "ca.crt"), str(ca_dir / "ca.key")
    sec = build_security(Settings(listen="0.0.0.0:7100", tls_cert=cert, tls_key=key))
    assert sec.auth_enabled and "TLS" in sec.describe()
    for bad, match in (
        (dict(tls_cert=cert), "go together"),
        (dict(tls_client_ca=ca), "need TLS"),
        (
            dict(tls_cert=cert, tls_key=key, tls_issuer_cert=ca, tls_issuer_key=ca_key),
            "agent_listen",
        ),
        (dict(tls_cert=cert, tls_key=key, agent_listen="127.0.0.1:0"), "tls_client_ca"),
        (dict(tls_cert=str(ca_dir / "missing.crt"), tls_key=key), "cannot read"),
    ):
        with pytest.raises(SecurityConfigError, match=match):
            build_security(Settings(**cast(dict[str, Any], bad)))
    full = build_security(
        Settings(
            tls_cert=cert,
            tls_key=key,
            tls_client_ca=ca,
            agent_listen="127.0.0.1:0",
            tls_issuer_cert=ca,
            tls_issuer_key=ca_key,
        )
    )
    assert full.issuer is not None and "mutual TLS" in full.describe()
    # With authentication off (loopback only) the agents' listener is plaintext; with
    # tokens but no TLS it needs certificates all the same.
    dev = build_security(Settings(agent_listen="127.0.0.1:0"))
    assert not dev.auth_enabled and "(plaintext)" in dev.describe()
    with pytest.raises(SecurityConfigError, match="authentication off"):
        build_security(Settings(agent_listen="0.0.0.0:7101"))


def test_agents_need_certificates_on_their_listener_once_authentication_is_on(tmp_path):
    token_file = tmp_path / "tokens.toml"
    token_file.write_text("")
    with pytest.raises(SecurityConfigError, match="need TLS"):
        build_security(Settings(token_file=str(token_file), agent_listen="127.0.0.1:0"))


def test_insecure_is_a_switch():
    config = load_config(["--insecure"], environ={})
    assert config.settings.insecure is True
    assert load_config([], environ={"LABELRM_INSECURE": "true"}).settings.insecure is True
    assert load_config([], environ={}).settings.insecure is False


def test_dev_tls_prepares_a_secured_loopback_setup(tmp_path):
    from rm_server.security import devtls
    from rm_server.security.tokens import TokenFile

    first = devtls.prepare(Settings(data_dir=tmp_path))
    sec = build_security(first.settings)
    assert sec.auth_enabled and sec.issuer is not None
    assert present(TokenFile(Path(first.settings.token_file)).lookup(first.admin_token)).roles >= {
        "admin"
    }
    second = devtls.prepare(Settings(data_dir=tmp_path))  # a restart: same CA, new token
    table = TokenFile(Path(second.settings.token_file))
    assert table.lookup(first.admin_token) is None and table.lookup(second.admin_token)
    assert (tmp_path / "pki" / "ca.crt").read_bytes() == first.ca.read_bytes()
    assert "--tls-cert" in second.agent_args


def test_metrics_off_loopback_obey_the_listeners_rule(tmp_path, ca_dir):
    token_file = tmp_path / "t.toml"
    token_file.write_text("")
    cert, key = str(ca_dir / "server.crt"), str(ca_dir / "server.key")
    exposed = "0.0.0.0:9100"
    with pytest.raises(SecurityConfigError, match="authentication off"):
        build_security(Settings(metrics_listen=exposed))
    with pytest.raises(SecurityConfigError, match=r"metrics .* without TLS"):
        build_security(Settings(metrics_listen=exposed, token_file=str(token_file)))
    with pytest.raises(SecurityConfigError, match="admin bearer token"):
        build_security(Settings(metrics_listen=exposed, tls_cert=cert, tls_key=key))
    tls, authorize = build_security(
        Settings(metrics_listen=exposed, tls_cert=cert, tls_key=key, token_file=str(token_file))
    ).metrics_guard()
    assert tls is not None and authorize is not None and not authorize(None)
    # On loopback the endpoint stays as it was: plain and open to local scrapers.
    local = build_security(Settings(metrics_listen="127.0.0.1:9100", token_file=str(token_file)))
    assert local.metrics_guard() == (None, None)
