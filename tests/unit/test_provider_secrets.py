"""Provider passwords by reference: what a secret's name may be, and where the RM reads
it (rm_server/external/secrets.py): files of provider_secrets_dir, then the prefixed
environment variables, never a path or another variable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rm_server.domain.external import AuthKind, ProviderConfig, ProviderConfigError, ProviderType
from rm_server.external.secrets import SecretMissing, SecretSource, env_name


def basic(password: str = "", password_secret: str = "") -> ProviderConfig:
    addresses = ("http://rm1:8088",)
    return ProviderConfig(
        "prod-yarn", ProviderType.YARN, "prod", addresses, AuthKind.BASIC, "yarn",
        password=password, password_secret=password_secret,
    )  # fmt: skip


def test_a_secrets_name_is_a_plain_name_and_excludes_a_stored_password():
    stored = basic(password_secret="prod_yarn-2")
    assert stored.to_config_json()["password_secret"] == "prod_yarn-2"
    assert stored.to_config_json()["password"] == ""
    assert (
        ProviderConfig.from_stored("prod-yarn", "yarn", "prod", stored.to_config_json()) == stored
    )
    assert stored.redacted() == stored  # the name is no secret
    for bad in ("../tokens.toml", "a/b", "DATABASE_URL", "-x", "x" * 64):
        with pytest.raises(ProviderConfigError) as err:
            basic(password_secret=bad)
        assert err.value.field == "password_secret", bad
    with pytest.raises(ProviderConfigError) as err:
        basic(password="s3cret", password_secret="prod-yarn")
    assert err.value.field == "password_secret"


def test_the_file_comes_first_then_the_environment(tmp_path: Path):
    source = SecretSource(str(tmp_path), {env_name("prod-yarn"): "from-env"})
    assert env_name("prod-yarn") == "LABELRM_PROVIDER_SECRET_PROD_YARN"
    assert source.read("prod-yarn") == "from-env"
    (tmp_path / "prod-yarn").write_text("from-file\n")
    assert source.read("prod-yarn") == "from-file"
    with pytest.raises(SecretMissing) as err:
        source.read("other")
    assert str(tmp_path / "other") in str(err.value) and "LABELRM_PROVIDER_SECRET_OTHER" in str(
        err.value
    )
    env_only = SecretSource("", {env_name("prod-yarn"): "from-env"})  # no directory
    assert env_only.read("prod-yarn") == "from-env"
    with pytest.raises(SecretMissing):
        SecretSource("", {"PROD_YARN": "x", "DATABASE_URL": "x"}).read("prod-yarn")


def test_what_is_not_a_readable_regular_file_is_refused(tmp_path: Path):
    source = SecretSource(str(tmp_path), {})
    (tmp_path / "empty").write_text("")
    os.mkfifo(tmp_path / "fifo")  # would block a plain open
    (tmp_path / "dir").mkdir()
    (tmp_path / "big").write_bytes(b"x" * (64 * 1024 + 1))
    for name in ("empty", "fifo", "dir", "big"):
        with pytest.raises(SecretMissing):
            source.read(name)
