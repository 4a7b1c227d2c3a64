"""The shared settings loader (labelrm_common/settings.py): one declaration per setting,
the same precedence, --print-config and one-line errors for rm-server, ecm-agent and the
EngineConn runtime."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from ecm_agent.main import main as agent_main
from engineconn.runtime import main as engineconn_main
from engineconn.settings import ENGINECONN
from labelrm_common.settings import (
    Program,
    Section,
    SettingsError,
    error_exit_code,
    load,
    load_or_exit,
    positive,
)
from rm_server.config import RM_SERVER, Settings
from rm_server.main import main as rm_main
from tests.support.env import ROOT

BASICS = Section("basics", "The basics")
SECRETS = Section("secrets", "Secrets")


@dataclass(frozen=True)
class Toy:
    name: str = BASICS.setting("toy", "a name")
    size: int = BASICS.setting(1, "a size", check=positive)
    ratio: float = BASICS.setting(0.5, "a ratio", env="TOY_RATIO_OVERRIDE")
    shape: str = BASICS.setting("round", "a shape", choices=("round", "square"))
    home: Path = BASICS.setting(Path("/tmp"), "a directory")
    loud: bool = BASICS.setting(False, "a switch")
    tags: tuple[str, ...] = BASICS.setting((), "tags", flag="--tag")
    owner: str = BASICS.setting("", "who owns it", required=True, file=False)
    password: str = SECRETS.setting("", "a secret", secret=True, also_from=("--password-file",))


TOY = Program(
    prog="toy",
    settings=Toy,
    description="A toy.",
    version="1.0",
    env_prefix="TOY_",
    config_env="TOY_CONFIG",
)


def test_precedence_and_sources(tmp_path: Path) -> None:
    config = tmp_path / "toy.toml"
    config.write_text('name = "file"\nsize = 2\ntags = ["a", "b"]\nhome = "/srv"\n')
    env = {"TOY_CONFIG": str(config), "TOY_SIZE": "3", "TOY_OWNER": "ann", "TOY_LOUD": "yes"}
    loaded = load(TOY, ["--size", "4", "--tag", "c", "--tag", "d"], env)
    s = loaded.settings
    assert (s.name, loaded.sources["name"]) == ("file", "file")
    assert (s.size, loaded.sources["size"]) == (4, "flag")  # flag > env > file
    assert (s.owner, s.loud, s.home) == ("ann", True, Path("/srv"))
    assert s.tags == ("c", "d")  # repeated flags replace the file's list
    assert s.ratio == 0.5 and "ratio" not in loaded.sources
    assert load(TOY, [], {**env, "TOY_TAGS": "x,y"}).settings.tags == ("x", "y")
    assert load(TOY, [], {"TOY_RATIO_OVERRIDE": "2", "TOY_OWNER": "o"}).settings.ratio == 2.0


@pytest.mark.parametrize(
    ("argv", "env", "file", "expected"),
    [
        (["--size", "big"], {}, "", "invalid value 'big' for size (--size)"),
        ([], {"TOY_SIZE": "0"}, "", "size must be positive, not 0 (TOY_SIZE)"),
        ([], {}, "shape = 'oval'\n", "shape must be one of round, square, not 'oval' ({file})"),
        ([], {}, "nonsense = 1\n", "unknown setting 'nonsense' in {file}"),
        ([], {}, "owner = 'x'\n", "unknown setting 'owner' in {file}"),  # not a file key
        ([], {}, "size = [\n", "cannot read config file {file}: "),
        (["--config", "/nonexistent/toy.toml"], {}, "", "cannot read config file /nonexistent/"),
        (["--password", "hunter2"], {}, "", "--password would show the password to every"),
        (["--nope"], {}, "", "unrecognized arguments: --nope (toy --help lists the settings)"),
    ],
)
def test_errors_name_the_setting_and_its_source(
    tmp_path: Path, argv: list[str], env: dict[str, str], file: str, expected: str
) -> None:
    env = {"TOY_OWNER": "ann", **env}
    if file:
        path = tmp_path / "toy.toml"
        path.write_text(file)
        argv = [*argv, "--config", str(path)]
        expected = expected.format(file=path)
    with pytest.raises(SettingsError) as refused:
        load(TOY, argv, env)
    assert expected in str(refused.value) and "\n" not in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_required_secret_refusal_and_the_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SettingsError, match=r"^owner is required: set --owner or TOY_OWNER$"):
        load(TOY, [], {})
    with pytest.raises(SettingsError) as refused:
        load(TOY, ["--password", "x"], {"TOY_OWNER": "o"})
    assert str(refused.value).endswith(
        "set TOY_PASSWORD, password in the config file, or --password-file"
    )
    # The one error line every program prints, and its exit code.
    assert error_exit_code("toy", SettingsError("size must be positive")) == 2
    assert capsys.readouterr().err == "toy: error: size must be positive\n"
    with pytest.raises(SystemExit) as exited:
        load_or_exit(TOY, ["--size", "-1"], {"TOY_OWNER": "o"})
    assert exited.value.code == 2
    assert capsys.readouterr().err == "toy: error: size must be positive, not -1 (--size)\n"


def test_print_config_is_toml_by_section_with_secrets_redacted() -> None:
    env = {"TOY_OWNER": "ann", "TOY_PASSWORD": "hunter2"}
    loaded = load(TOY, ["--print-config", "--tag", "a", "--loud"], env)
    assert loaded.print_config
    text = loaded.describe()
    assert "hunter2" not in text and 'password = "***"  # env (TOY_PASSWORD)' in text
    assert 'tags = ["a"]  # flag (TOY_TAGS, --tag)' in text
    assert "loud = true  # flag (TOY_LOUD, --loud)" in text
    assert text.index("# --- The basics") < text.index("# --- Secrets")
    parsed = tomllib.loads(text)
    assert parsed["tags"] == ["a"] and parsed["size"] == 1 and parsed["home"] == "/tmp"


def test_every_setting_is_declared_with_a_description() -> None:
    @dataclass(frozen=True)
    class Undescribed:
        plain: int = 3

    program = Program("x", Undescribed, "", "1", "X_")
    with pytest.raises(TypeError, match="plain is no described setting"):
        load(program, [], {})
    assert {spec.name for spec in RM_SERVER.specs} == set(Settings.__dataclass_fields__)
    # docs/configuration.md covers the EngineConn runtime from the same declarations.
    text = (ROOT / "docs" / "configuration.md").read_text()
    for spec in ENGINECONN.specs:
        assert f"| `{spec.name}` |" in text and (not spec.env or f"`{spec.env}`" in text)


# --- --print-config of the daemons ------------------------------------------------------


def test_rm_server_print_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "rm.toml"
    config.write_text('listen = "127.0.0.1:7999"\ndatabase_url = "postgresql://u:pw@h/db"\n')
    monkeypatch.setenv("LABELRM_POOL_MAX", "6")
    assert rm_main(["--config", str(config), "--print-config", "--log-level", "debug"]) == 0
    out = capsys.readouterr().out
    assert 'listen = "127.0.0.1:7999"  # file (LABELRM_LISTEN, --listen)' in out
    assert "pool_max = 6  # env (LABELRM_POOL_MAX, --pool-max)" in out
    assert 'log_level = "debug"  # flag' in out
    assert "pw@" not in out and 'database_url = "postgresql://u:***@h/db"  # file' in out
    assert "# --- Database" in out and "# --- Security: TLS" in out
    assert set(tomllib.loads(out)) == set(Settings.__dataclass_fields__)
    # A bad value with --print-config is the one error line, not the configuration.
    with pytest.raises(SystemExit) as exited:
        rm_main(["--print-config", "--log-level", "loud"])
    assert exited.value.code == 2
    err = capsys.readouterr()
    assert err.out == "" and err.err.startswith("rm-server: error: log_level must be one of")


def test_ecm_agent_print_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "agent.token"
    token.write_text("lrm_secret_token\n")
    token.chmod(0o600)
    argv = ["--print-config", "--token-file", str(token), "--agent-id", "w1", "--labels", "a=b"]
    assert agent_main(argv) == 0
    out = capsys.readouterr().out
    assert "lrm_secret_token" not in out and 'token = "***"' in out
    assert 'agent_id = "w1"  # flag (LABELRM_AGENT_AGENT_ID, --agent-id)' in out
    assert "# --- Reaching the RM securely" in out
    assert tomllib.loads(out)["labels"] == "a=b"
    assert agent_main(["--token", "lrm_secret_token"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ecm-agent: error: --token would show") and err.count("\n") == 1
    assert "lrm_secret_token" not in err


def test_engineconn_print_config(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--print-config", "--ec-id", "e1", "--rm", "h:1", "--engine", "shell"]
    monkeypatch.delenv("LABELRM_EC_SECRET", raising=False)
    assert engineconn_main([*argv, "--insecure-executor", "--label", "k=v"]) == 0
    out = capsys.readouterr().out
    assert 'labels = ["k=v"]  # flag (LABELRM_LABELS, --label)' in out
    assert "insecure_executor = true  # flag (--insecure-executor)" in out
    assert tomllib.loads(out)["engine"] == "shell"


def _run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )


def test_print_config_and_the_error_line_in_real_processes() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABELRM_")}
    done = _run(
        "-m", "ecm_agent", "--print-config", "--kill-grace", "7",
        env={**env, "LABELRM_AGENT_TOKEN": "lrm_env_token", "LABELRM_AGENT_LABELS": "c=1"},
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == ""
    assert "lrm_env_token" not in done.stdout and 'token = "***"  # env' in done.stdout
    assert "kill_grace = 7.0  # flag" in done.stdout and 'labels = "c=1"  # env' in done.stdout
    # The same one error line, exit 2 and no traceback from every program.
    for argv, prog, variable in (
        (("-m", "rm_server"), "rm-server", "LABELRM_KILL_GRACE"),
        (("-m", "ecm_agent"), "ecm-agent", "LABELRM_AGENT_KILL_GRACE"),
        (("-m", "engineconn"), "python -m engineconn", "LABELRM_HEARTBEAT_INTERVAL"),
    ):
        done = _run(*argv, "--print-config", env={**env, variable: "soon"})
        name = variable.removeprefix("LABELRM_AGENT_").removeprefix("LABELRM_").lower()
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == f"{prog}: error: invalid value 'soon' for {name} ({variable})\n"
