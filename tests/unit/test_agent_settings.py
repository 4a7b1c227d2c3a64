"""ecm-agent settings: where its bearer token may come from."""

from __future__ import annotations

import pytest

from ecm_agent.settings import SettingsError, load_agent_settings


def test_the_token_is_never_taken_from_the_command_line():
    # SettingsError: ecm-agent prints it as one line and exits 2.
    with pytest.raises(SettingsError) as refused:
        load_agent_settings(["--token", "lrm_secret"], environ={})
    err = str(refused.value)
    assert "LABELRM_AGENT_TOKEN" in err and "--token-file" in err
    assert "lrm_secret" not in err


def test_the_token_comes_from_the_environment_or_a_private_file(tmp_path):
    st = load_agent_settings([], environ={"LABELRM_AGENT_TOKEN": "lrm_from_env"})
    assert st.token == "lrm_from_env"
    assert "lrm_from_env" not in repr(st)
    path = tmp_path / "agent.token"
    path.write_text("lrm_from_file\n")
    path.chmod(0o600)
    st = load_agent_settings(["--token-file", str(path)], environ={})
    assert st.token == "lrm_from_file"
    config = tmp_path / "agent.toml"
    config.write_text(f'token_file = "{path}"\n')
    assert load_agent_settings(["--config", str(config)], environ={}).token == "lrm_from_file"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_token_file_others_can_read_is_refused(tmp_path, mode):
    path = tmp_path / "agent.token"
    path.write_text("lrm_from_file\n")
    path.chmod(mode)
    with pytest.raises(SettingsError) as refused:
        load_agent_settings(["--token-file", str(path)], environ={})
    assert "chmod 600" in str(refused.value)
