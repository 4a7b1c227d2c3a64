"""The agent's launch validation and launch-script rendering (pure; bash runs the script)."""

from __future__ import annotations

import ast
import datetime as dt
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ecm_agent.launch import (
    launch_environment,
    render_launch_script,
    work_dir_for,
)
from ecm_agent.validate import (
    AGENT_ENV_NAMES,
    DENIED_ENV_NAMES,
    MAX_ARG_BYTES,
    MAX_ARGV,
    MAX_ENV,
    MAX_ENV_VALUE_BYTES,
    MAX_MATERIAL_BYTES,
    AgentPolicy,
    LaunchRefused,
    LaunchSpec,
    MaterialFile,
    default_pwd_lookup,
    validate_launch,
)

USERS = {
    "alice": (1500, 1500, "/home/alice"),
    "bob": (1501, 1501, "/home/bob"),
    "root": (0, 0, "/root"),
    "toor": (0, 0, "/root"),  # an alias of uid 0
    "daemon1": (2, 2, "/"),
    "grp0": (1600, 0, "/home/grp0"),
    "_svc-x": (1700, 1700, "/home/svc"),
}


def lookup(name: str) -> tuple[int, int, str] | None:
    return USERS.get(name)


POLICY = AgentPolicy(
    work_root=Path("/srv/labelrm/work"),
    state_dir=Path("/var/lib/labelrm/state"),
    allowed_users=frozenset({"alice", "root", "toor", "daemon1", "grp0", "ghost", "_svc-x"}),
    programs={"python": sys.executable, "bash": "/bin/bash"},
    local_env={"JAVA_HOME": "/opt/java", "SPARK_HOME": "/opt/spark dir/$x"},
)


def spec(**over: object) -> LaunchSpec:
    base: dict[str, object] = {
        "ec_id": "ec-123",
        "user": "alice",
        "engine": "shell",
        "program": "bash",
        "argv": ("-c", "echo hi"),
        "environment": {"FOO": "bar"},
    }
    base.update(over)
    return LaunchSpec(**base)  # type: ignore[arg-type]


def refused(s: LaunchSpec, policy: AgentPolicy = POLICY) -> LaunchRefused:
    with pytest.raises(LaunchRefused) as info:
        validate_launch(s, policy, lookup)
    assert isinstance(info.value, ValueError)
    return info.value


# ----- accepted ------------------------------------------------------------------------


def test_valid_launch_resolves_user_and_program():
    v = validate_launch(
        spec(
            required_local_environment=("JAVA_HOME",), material_files=(MaterialFile("a.py", b"x"),)
        ),
        POLICY,
        lookup,
    )
    assert (v.uid, v.gid, v.home) == (1500, 1500, "/home/alice")
    assert v.program_path == "/bin/bash"
    assert dict(v.environment) == {"FOO": "bar", "JAVA_HOME": "/opt/java"}


def test_default_lookup_finds_root_and_not_a_ghost():
    assert default_pwd_lookup("root") == (0, 0, "/root")
    assert default_pwd_lookup(f"nx_{uuid.uuid4().hex[:20]}") is None


# ----- user ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "user",
    ["", "Alice", "a;b", "../x", "a b", "a\n", "1abc", "-x", "a" * 33, "al/ice", "al$", "é"],
)
def test_malformed_user_names_refused(user):
    assert refused(spec(user=user)).field == "user"


def test_underscore_and_dash_user_allowed():
    assert validate_launch(spec(user="_svc-x"), POLICY, lookup).uid == 1700


@pytest.mark.parametrize("user", ["root", "toor"])
def test_root_refused_even_if_allowed(user):
    err = refused(spec(user=user))
    assert err.field == "user" and "root" in err.reason


def test_low_uid_refused():
    assert "minimum" in refused(spec(user="daemon1")).reason


def test_min_uid_is_configurable():
    policy = AgentPolicy(
        work_root=POLICY.work_root,
        state_dir=POLICY.state_dir,
        allowed_users=frozenset({"alice"}),
        programs=POLICY.programs,
        min_uid=1501,
    )
    assert "minimum" in refused(spec(), policy).reason


def test_primary_group_root_refused():
    assert refused(spec(user="grp0")).field == "user"


def test_user_not_allowed_refused():
    assert "allowed" in refused(spec(user="bob")).reason


def test_unknown_user_refused():
    assert "does not exist" in refused(spec(user="ghost")).reason


# ----- environment ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "1A", "A-B", "A=B", "A B", "A\n", "A.B", "É", "A;B"])
def test_malformed_env_names_refused(name):
    assert refused(spec(environment={name: "x"})).field == f"environment[{name}]"


@pytest.mark.parametrize(
    "name",
    [
        *sorted(DENIED_ENV_NAMES | AGENT_ENV_NAMES),
        *("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "BASH_FUNC_x", "BASH_XTRACEFD"),
    ],
)
def test_denied_env_names_refused(name):
    err = refused(spec(environment={"OK": "1", name: "x"}))
    assert err.field == f"environment[{name}]"


def test_issue_denied_names_are_in_the_set():
    for name in ("LD_PRELOAD", "BASH_ENV", "ENV", "PATH", "IFS"):
        assert refused(spec(environment={name: "x"})).field == f"environment[{name}]"


def test_the_rms_executor_secret_is_passed_on_but_agent_names_stay_reserved():
    # The RM sets LABELRM_EC_SECRET in every launch; the agent must not refuse it, and
    # allowing it must not open the names the agent sets itself. It is passed on as a
    # file of the user's: the launch script exports only that file's path.
    env = {"LABELRM_EC_SECRET": "s3cr3t-_A"}
    v = validate_launch(spec(environment=env), POLICY, lookup)
    exported = launch_environment(v, Path("/w"))
    assert "LABELRM_EC_SECRET" not in exported
    assert exported["LABELRM_EC_SECRET_FILE"] == "/w/labelrm-ec.secret"
    assert "LABELRM_EC_SECRET" not in AGENT_ENV_NAMES
    for name in AGENT_ENV_NAMES:
        assert refused(spec(environment={**env, name: "x"})).reason == "is set by the agent"


def test_env_value_nul_refused():
    assert refused(spec(environment={"A": "x\0y"})).field == "environment[A]"


def test_env_value_lone_surrogate_refused():
    assert "UTF-8" in refused(spec(environment={"A": "x\udc80"})).reason


def test_env_value_size_limit():
    ok = "é" * (MAX_ENV_VALUE_BYTES // 2)  # two bytes each: exactly at the limit
    validate_launch(spec(environment={"A": ok}), POLICY, lookup)
    assert refused(spec(environment={"A": ok + "x"})).field == "environment[A]"


def test_env_count_limit():
    env = {f"V{i}": "x" for i in range(MAX_ENV)}
    validate_launch(spec(environment=env), POLICY, lookup)
    env["ONE_MORE"] = "x"
    assert refused(spec(environment=env)).field == "environment"


def test_argv_and_env_together_stay_under_arg_max():
    env = {f"V{i}": "x" * 60_000 for i in range(20)}
    assert "exceed" in refused(spec(environment=env)).reason


def test_dangerous_values_are_accepted_because_they_are_quoted():
    values = {"A": "$(touch /tmp/pwned)", "B": "`id`", "C": "'; rm -rf /", "D": "a\nb\r\n"}
    assert dict(validate_launch(spec(environment=values), POLICY, lookup).environment) == values


# ----- required local environment ------------------------------------------------------


def test_required_local_env_provided_by_agent():
    v = validate_launch(spec(required_local_environment=("SPARK_HOME",)), POLICY, lookup)
    assert v.environment["SPARK_HOME"] == "/opt/spark dir/$x"


def test_required_local_env_missing_names_the_variable():
    err = refused(spec(required_local_environment=("JAVA_HOME", "HADOOP_HOME")))
    assert err.field == "required_local_environment[1]" and "HADOOP_HOME" in err.reason


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PATH", "A-B", ""])
def test_required_local_env_names_validated(name):
    assert refused(spec(required_local_environment=(name,))).field == (
        "required_local_environment[0]"
    )


def test_required_local_env_may_not_also_be_in_request():
    err = refused(
        spec(environment={"JAVA_HOME": "/evil"}, required_local_environment=("JAVA_HOME",))
    )
    assert err.field == "required_local_environment[0]"


# ----- argv and program ----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b", "\n"])
def test_argv_control_chars_refused(bad):
    assert refused(spec(argv=("-c", "x", bad))).field == "argv[2]"


def test_argv_limits():
    validate_launch(spec(argv=("x",) * MAX_ARGV), POLICY, lookup)
    assert refused(spec(argv=("x",) * (MAX_ARGV + 1))).field == "argv"
    validate_launch(spec(argv=("x" * MAX_ARG_BYTES,)), POLICY, lookup)
    assert refused(spec(argv=("y", "x" * (MAX_ARG_BYTES + 1)))).field == "argv[1]"


def test_argv_may_hold_shell_syntax():
    argv = ("-c", "$(touch /tmp/pwned)", "`id`", "'; rm -rf /", "", "a b")
    assert validate_launch(spec(argv=argv), POLICY, lookup).spec.argv == argv


@pytest.mark.parametrize("program", ["sh", "/bin/bash", "bash ", "", "../bash", "Python"])
def test_program_must_be_a_known_name(program):
    assert refused(spec(program=program)).field == "program"


def test_program_path_is_the_agents():
    assert validate_launch(spec(program="python"), POLICY, lookup).program_path == sys.executable


# ----- material files ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../../etc/x", "a/b", "/etc/passwd", ".", "..", "", "a\0b", "x" * 129, "a b", "a\nb", "é"],
)
def test_bad_material_names_refused(name):
    files = (MaterialFile("ok.txt", b""), MaterialFile(name, b"x"))
    assert refused(spec(material_files=files)).field == "material_files[1].name"


@pytest.mark.parametrize("name", ["launch.sh", "logs", "tmp"])
def test_material_names_reserved_for_the_agent(name):
    assert refused(spec(material_files=(MaterialFile(name, b""),))).field == (
        "material_files[0].name"
    )


def test_material_names_unique():
    files = (MaterialFile("a", b""), MaterialFile("a", b""))
    assert "twice" in refused(spec(material_files=files)).reason


def test_material_total_size_bounded():
    half = b"x" * (MAX_MATERIAL_BYTES // 2)
    validate_launch(
        spec(material_files=(MaterialFile("a", half), MaterialFile("b", half))), POLICY, lookup
    )
    files = (MaterialFile("a", half), MaterialFile("b", half + b"x"))
    assert refused(spec(material_files=files)).field == "material_files"


def test_material_dotfiles_allowed():
    validate_launch(
        spec(material_files=(MaterialFile(".env", b""), MaterialFile("..a", b""))), POLICY, lookup
    )


# ----- engine and ec id ----------------------------------------------------------------


@pytest.mark.parametrize("engine", ["", "Shell", "shell-1", "../x", "1sh", "a" * 33, "sh ell"])
def test_bad_engine_refused(engine):
    assert refused(spec(engine=engine)).field == "engine"


@pytest.mark.parametrize("ec_id", ["", ".", "..", "a/b", "../x", "x" * 129, "a b", "a\0"])
def test_bad_ec_id_refused(ec_id):
    assert refused(spec(ec_id=ec_id)).field == "ec_id"


def test_ec_id_may_contain_dots_and_dashes():
    validate_launch(spec(ec_id="ec_1.2-3", engine="python3"), POLICY, lookup)


# ----- policy --------------------------------------------------------------------------


def test_policy_normalises_and_checks():
    p = AgentPolicy(
        work_root="/w",  # type: ignore[arg-type]
        state_dir=Path("/s"),
        allowed_users={"a"},  # type: ignore[arg-type]
        programs={"bash": "/bin/bash"},
    )
    assert p.work_root == Path("/w") and p.allowed_users == frozenset({"a"})
    assert p.min_uid == 1000 and p.kill_grace == 5.0 and dict(p.local_env) == {}
    with pytest.raises(TypeError):
        p.programs["sh"] = "/bin/sh"  # type: ignore[index]
    for bad in (
        {"work_root": Path("rel")},
        {"programs": {"bash": "bash"}},
        {"local_env": {"A-B": "x"}},
        {"min_uid": 0},
    ):
        kwargs = {
            "work_root": Path("/w"),
            "state_dir": Path("/s"),
            "allowed_users": frozenset(),
            "programs": {},
        }
        kwargs.update(bad)
        with pytest.raises(ValueError):
            AgentPolicy(**kwargs)  # type: ignore[arg-type]


# ----- rendering -----------------------------------------------------------------------


def render(
    env: dict[str, str],
    work_dir: Path = Path("/w/alice/20240102/shell/ec-1"),
    program="/bin/bash",
    argv=("-c", "true"),
) -> str:
    return render_launch_script(work_dir=work_dir, program_path=program, argv=argv, environment=env)


def test_work_dir_layout():
    s = spec()
    assert work_dir_for(POLICY, s, dt.date(2024, 1, 2)) == Path(
        "/srv/labelrm/work/alice/20240102/shell/ec-123"
    )


def test_script_shape():
    v = validate_launch(spec(required_local_environment=("JAVA_HOME",)), POLICY, lookup)
    wd = Path("/w/my dir")
    script = render_launch_script(
        work_dir=wd,
        program_path="/bin/bash",
        argv=v.spec.argv,
        environment=launch_environment(v, wd),
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "set -euo pipefail" in lines
    assert "cd -- '/w/my dir'" in lines
    assert "export FOO=bar" in lines and "export JAVA_HOME=/opt/java" in lines
    assert "export LABELRM_EC_ID=ec-123" in lines
    assert "export TMPDIR='/w/my dir/tmp'" in lines
    assert lines[-1] == "exec /bin/bash -c 'echo hi' >>logs/stdout.log 2>>logs/stderr.log"
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_render_rechecks_names_and_nul():
    with pytest.raises(ValueError):
        render({"A;B": "x"})
    with pytest.raises(ValueError):
        render({"A": "\0"})
    with pytest.raises(ValueError):
        render({}, argv=("\0",))


env_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True)
env_values = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40
)
envs = st.dictionaries(env_names, env_values, max_size=8)
# Printable ASCII plus the characters that matter to a shell.
shellish = st.text(
    st.sampled_from(
        [chr(c) for c in range(32, 127)] + ["\n", "\r", "\t", "\x01", "\x7f", "é", "€"]
    ),
    max_size=40,
)
one_line = st.text(
    st.sampled_from([chr(c) for c in range(32, 127)] + ["\t", "\x01", "\x7f", "é"]), max_size=40
)


@given(envs)
def test_exports_round_trip_through_shlex(env):
    script = render(env)
    words = shlex.split(script, comments=True)
    exported = [words[i + 1] for i, w in enumerate(words) if w == "export"]
    assert exported == [f"{k}={v}" for k, v in env.items()]


def run_script(
    tmp: Path, env: dict[str, str], argv: tuple[str, ...] = ()
) -> tuple[dict[str, str], list[str]]:
    """Render a script whose program is a printer of its environment and argv, run it
    with `env -i bash`, and read back what the program really received."""
    (tmp / "logs").mkdir(exist_ok=True)
    for name in ("stdout.log", "stderr.log"):
        (tmp / "logs" / name).unlink(missing_ok=True)
    printer = (
        "import os,sys; sys.stdout.buffer.write(repr((dict(os.environ), sys.argv[1:])).encode())"
    )
    script = render_launch_script(
        work_dir=tmp, program_path=sys.executable, argv=("-c", printer, *argv), environment=env
    )
    path = tmp / "launch.sh"
    path.write_text(script, encoding="utf-8")
    subprocess.run(["env", "-i", "/bin/bash", str(path)], check=True, cwd="/", timeout=30)
    got_env, got_argv = ast.literal_eval((tmp / "logs" / "stdout.log").read_text(encoding="utf-8"))
    return got_env, got_argv


DANGEROUS = [
    "$(touch {pwned})",
    "`touch {pwned}`",
    "'; touch {pwned}; '",
    '"; touch {pwned}; "',
    "a\ntouch {pwned}\n",
    "\\'$(touch {pwned})\\'",
    "${{IFS}}$(touch {pwned})",
    "~root/*",
    "-n",
    "",
    " lead and trail ",
    "\r\n\t",
]


def test_dangerous_values_arrive_verbatim_and_run_nothing(tmp_path):
    pwned = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    values = [v.format(pwned=pwned) for v in DANGEROUS]
    env = {f"V{i}": v for i, v in enumerate(values)}
    argv = tuple(v for v in values if "\n" not in v and "\r" not in v)
    got_env, got_argv = run_script(tmp_path, env, argv)
    for name, value in env.items():
        assert got_env[name] == value
    assert got_argv == list(argv)
    assert not pwned.exists()
    # The agent's variables are set, and bash saw nothing else from us.
    assert got_env["PWD"] == str(tmp_path)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(env=st.dictionaries(env_names, shellish, max_size=6), argv=st.lists(one_line, max_size=4))
def test_random_values_survive_bash(tmp_path, env, argv):
    got_env, got_argv = run_script(tmp_path, env, tuple(argv))
    for name, value in env.items():
        assert got_env[name] == value
    assert got_argv == argv


def test_syntax_check_with_every_byte(tmp_path):
    value = "".join(chr(c) for c in range(1, 256))
    script = render({"ALL": value})
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    got_env, _ = run_script(tmp_path, {"ALL": value})
    assert got_env["ALL"] == value
    assert os.path.exists(tmp_path / "launch.sh")
