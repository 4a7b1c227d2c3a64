"""Validation of launch requests in the agent, whatever the RM sent.

Everything here is pure: the only outside knowledge (the user database) comes
through an injected lookup function, so every rule is unit-testable without
users, sudo or a file system. A refusal raises :class:`LaunchRefused` naming the
offending field; the agent reports it to the RM and launches nothing.

The threat model: a request is data from the network. It chooses *which* allowed
user runs *which* allowlisted program with *which* arguments and environment, and
nothing else: it never names an executable path, never reaches a shell unquoted,
and never writes outside the EngineConn's work directory.
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from labelrm_common.launch import MaterialFile

__all__ = [
    "AGENT_ENV_NAMES",
    "DENIED_ENV_NAMES",
    "DENIED_ENV_PREFIXES",
    "ENV_NAME_RE",
    "MAX_ARGV",
    "MAX_ARG_BYTES",
    "MAX_ENV",
    "MAX_ENV_VALUE_BYTES",
    "MAX_EXEC_BYTES",
    "MAX_MATERIAL_BYTES",
    "RESERVED_WORK_DIR_NAMES",
    "SECRET_ENV",
    "SECRET_FILE",
    "SECRET_FILE_ENV",
    "AgentPolicy",
    "LaunchRefused",
    "LaunchSpec",
    "MaterialFile",
    "UserLookup",
    "ValidatedLaunch",
    "default_pwd_lookup",
    "validate_engine",
    "validate_env_name",
    "validate_launch",
    "validate_user",
]

USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENGINE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
EC_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
MATERIAL_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")

#: Variables a request may not set. PATH/IFS/ENV/BASH_ENV and friends change how
#: bash or the dynamic loader behave; UID/EUID/PPID are read-only in bash, so
#: exporting them would make `set -e` abort the launch script.
DENIED_ENV_NAMES: frozenset[str] = frozenset(
    {
        "ENV",
        "PATH",
        "IFS",
        "CDPATH",
        "GLOBIGNORE",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PROMPT_COMMAND",
        "PYTHONSTARTUP",
        "UID",
        "EUID",
        "PPID",
        "GCONV_PATH",
    }
)
#: Prefixes a request may not set: LD_* (LD_PRELOAD, LD_LIBRARY_PATH, ...) and
#: BASH_* (BASH_ENV, BASH_FUNC_name%% exported functions, BASH_XTRACEFD, ...).
DENIED_ENV_PREFIXES: tuple[str, ...] = ("LD_", "BASH_")
#: The executor's bearer token, chosen by the RM. The agent never writes it into the
#: launch script (root's, mode 0644, and readable by whoever can enter the directory,
#: such as the members of the user's group) nor into an environment a `ps e` shows: it
#: goes into SECRET_FILE (the user's, 0600) and the EngineConn gets that file's path.
SECRET_ENV = "LABELRM_EC_SECRET"
SECRET_FILE_ENV = "LABELRM_EC_SECRET_FILE"
SECRET_FILE = "labelrm-ec.secret"
#: Set by the agent itself in every launch script; a request may not override them.
AGENT_ENV_NAMES: frozenset[str] = frozenset({"LABELRM_EC_ID", "TMPDIR", SECRET_FILE_ENV})
#: Names in the work directory the agent creates itself; material files may not take them.
RESERVED_WORK_DIR_NAMES: frozenset[str] = frozenset({"launch.sh", "logs", "tmp", SECRET_FILE})

MAX_ENV = 256
MAX_ENV_NAME_BYTES = 256
MAX_ENV_VALUE_BYTES = 64 * 1024
MAX_ARGV = 256
MAX_ARG_BYTES = 64 * 1024
#: argv + environment together: Linux's ARG_MAX is a quarter of the stack limit
#: (2 MiB by default); staying well under it means exec never fails with E2BIG.
MAX_EXEC_BYTES = 1024 * 1024
MAX_MATERIAL_FILES = 64
MAX_MATERIAL_BYTES = 16 * 1024 * 1024
MAX_QUANTITY = 2**62  # a granted memory or CPU figure (bytes, millicores)


class LaunchRefused(ValueError):
    """A launch request the agent will not run. ``field`` names what was wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


#: (uid, gid, home) of a user name, or None when there is no such user.
UserLookup = Callable[[str], "tuple[int, int, str] | None"]


def default_pwd_lookup(name: str) -> tuple[int, int, str] | None:
    """Look a user up in the system user database (NSS)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid, entry.pw_dir


@dataclass(frozen=True)
class AgentPolicy:
    """The agent's own settings: where EngineConns live and what they may be.

    ``programs`` maps the program names a request may use to the agent's local
    executables (for example ``{"python": sys.executable, "bash": "/bin/bash"}``);
    ``local_env`` holds the values of variables a request may require by name.
    """

    work_root: Path
    state_dir: Path
    allowed_users: frozenset[str]
    programs: Mapping[str, str]
    min_uid: int = 1000
    local_env: Mapping[str, str] = field(default_factory=dict)
    kill_grace: float = 5.0

    def __post_init__(self) -> None:
        # Normalise so callers may pass sets, lists and dicts; the copies are
        # read-only so a policy cannot change under a running launch.
        object.__setattr__(self, "work_root", Path(self.work_root))
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        object.__setattr__(self, "allowed_users", frozenset(self.allowed_users))
        object.__setattr__(self, "programs", MappingProxyType(dict(self.programs)))
        object.__setattr__(self, "local_env", MappingProxyType(dict(self.local_env)))
        if not self.work_root.is_absolute() or not self.state_dir.is_absolute():
            raise ValueError("work_root and state_dir must be absolute paths")
        for name, path in self.programs.items():
            if not Path(path).is_absolute() or "\0" in path:
                raise ValueError(f"program {name!r} must map to an absolute path, got {path!r}")
        for name, value in self.local_env.items():
            if not ENV_NAME_RE.fullmatch(name) or "\0" in value:
                raise ValueError(f"local_env entry {name!r} is not a valid variable")
        if self.min_uid < 1:
            raise ValueError("min_uid must be at least 1: root never runs EngineConns")
        if self.kill_grace < 0:
            raise ValueError("kill_grace must not be negative")


@dataclass(frozen=True)
class LaunchSpec:
    """One EngineConn launch, as received from the RM (not yet trusted)."""

    ec_id: str
    user: str
    engine: str
    program: str
    argv: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    required_local_environment: tuple[str, ...] = ()
    material_files: tuple[MaterialFile, ...] = ()
    # What the RM granted on this ECM (0: that dimension was not granted): the limits
    # of its cgroup when the agent contains its EngineConns.
    memory_bytes: int = 0
    cpu_millis: int = 0


@dataclass(frozen=True)
class ValidatedLaunch:
    """A launch that passed every rule, with the user and program resolved."""

    spec: LaunchSpec
    uid: int
    gid: int
    home: str
    program_path: str
    #: request environment + required local environment (agent values), in order.
    environment: Mapping[str, str]


def _utf8_len(field_name: str, value: str) -> int:
    # Proto strings are UTF-8; a lone surrogate cannot be written to the script.
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise LaunchRefused(field_name, "not valid UTF-8") from None


def validate_user(
    user: str, policy: AgentPolicy, lookup_user: UserLookup = default_pwd_lookup
) -> tuple[int, int, str]:
    """Check the user a launch runs as; return its (uid, gid, home)."""
    if not isinstance(user, str) or not USER_RE.fullmatch(user):
        raise LaunchRefused("user", f"{user!r} is not a valid user name")
    if user == "root":
        raise LaunchRefused("user", "root never runs EngineConns")
    if user not in policy.allowed_users:
        raise LaunchRefused("user", f"{user!r} is not in the allowed users")
    found = lookup_user(user)
    if found is None:
        raise LaunchRefused("user", f"{user!r} does not exist")
    uid, gid, home = found
    # Checked again after the lookup: an allowlisted name could alias uid 0.
    if uid == 0 or gid == 0:
        raise LaunchRefused("user", f"{user!r} has root's uid or primary group")
    if uid < policy.min_uid:
        raise LaunchRefused("user", f"{user!r} has uid {uid} < minimum {policy.min_uid}")
    return uid, gid, home


def validate_env_name(name: str, field_name: str) -> None:
    """Check that ``name`` is a plain variable name a request may set."""
    if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
        raise LaunchRefused(field_name, "not a valid variable name")
    if len(name) > MAX_ENV_NAME_BYTES:
        raise LaunchRefused(field_name, f"name longer than {MAX_ENV_NAME_BYTES}")
    if name in DENIED_ENV_NAMES or name.startswith(DENIED_ENV_PREFIXES):
        raise LaunchRefused(field_name, "may not be set by a request")
    if name in AGENT_ENV_NAMES:
        raise LaunchRefused(field_name, "is set by the agent")


def validate_engine(engine: str) -> None:
    """Check the engine name used as a path component."""
    if not isinstance(engine, str) or not ENGINE_RE.fullmatch(engine):
        raise LaunchRefused("engine", f"{engine!r} is not a valid engine name")


def _validate_ec_id(ec_id: str) -> None:
    if not isinstance(ec_id, str) or not EC_ID_RE.fullmatch(ec_id) or ec_id in (".", ".."):
        raise LaunchRefused("ec_id", f"{ec_id!r} is not a valid EngineConn id")


def _validate_environment(spec: LaunchSpec, policy: AgentPolicy) -> dict[str, str]:
    if len(spec.environment) > MAX_ENV:
        raise LaunchRefused("environment", f"more than {MAX_ENV} variables")
    env: dict[str, str] = {}
    for name, value in spec.environment.items():
        label = f"environment[{name}]"
        validate_env_name(name, label)
        if not isinstance(value, str) or "\0" in value:
            raise LaunchRefused(label, "value must be a string without NUL bytes")
        if _utf8_len(label, value) > MAX_ENV_VALUE_BYTES:
            raise LaunchRefused(label, f"value longer than {MAX_ENV_VALUE_BYTES} bytes")
        env[name] = value
    if len(spec.required_local_environment) > MAX_ENV:
        raise LaunchRefused("required_local_environment", f"more than {MAX_ENV} variables")
    for i, name in enumerate(spec.required_local_environment):
        label = f"required_local_environment[{i}]"
        validate_env_name(name, label)
        if name not in policy.local_env:
            raise LaunchRefused(label, f"{name} is not provided by this agent")
        if name in env:
            raise LaunchRefused(label, f"{name} is also set by the request")
        env[name] = policy.local_env[name]
    return env


def _validate_argv(argv: tuple[str, ...]) -> int:
    if len(argv) > MAX_ARGV:
        raise LaunchRefused("argv", f"more than {MAX_ARGV} arguments")
    total = 0
    for i, arg in enumerate(argv):
        label = f"argv[{i}]"
        if not isinstance(arg, str):
            raise LaunchRefused(label, "must be a string")
        # NUL cannot be passed to exec at all; CR/LF are refused rather than
        # merely quoted so that no argument can forge extra lines in logs or
        # line-based protocols of the engine.
        if "\0" in arg or "\n" in arg or "\r" in arg:
            raise LaunchRefused(label, "contains NUL, newline or carriage return")
        size = _utf8_len(label, arg)
        if size > MAX_ARG_BYTES:
            raise LaunchRefused(label, f"longer than {MAX_ARG_BYTES} bytes")
        total += size + 1
    return total


def _validate_material_files(files: tuple[MaterialFile, ...]) -> None:
    if len(files) > MAX_MATERIAL_FILES:
        raise LaunchRefused("material_files", f"more than {MAX_MATERIAL_FILES} files")
    seen: set[str] = set()
    total = 0
    for i, material in enumerate(files):
        label = f"material_files[{i}].name"
        name = material.name
        if not isinstance(name, str) or not MATERIAL_NAME_RE.fullmatch(name) or name in (".", ".."):
            raise LaunchRefused(label, f"{name!r} is not a plain file name")
        if name in RESERVED_WORK_DIR_NAMES:
            raise LaunchRefused(label, f"{name!r} is reserved for the agent")
        if name in seen:
            raise LaunchRefused(label, f"{name!r} appears twice")
        seen.add(name)
        if not isinstance(material.content, bytes):
            raise LaunchRefused(f"material_files[{i}].content", "must be bytes")
        total += len(material.content)
    if total > MAX_MATERIAL_BYTES:
        raise LaunchRefused("material_files", f"more than {MAX_MATERIAL_BYTES} bytes in total")


def validate_launch(
    spec: LaunchSpec, policy: AgentPolicy, lookup_user: UserLookup = default_pwd_lookup
) -> ValidatedLaunch:
    """Check every rule on ``spec``; return it with the user and program resolved.

    Raises :class:`LaunchRefused` on the first rule broken.
    """
    _validate_ec_id(spec.ec_id)
    validate_engine(spec.engine)
    uid, gid, home = validate_user(spec.user, policy, lookup_user)
    if not isinstance(spec.program, str) or spec.program not in policy.programs:
        raise LaunchRefused("program", f"{spec.program!r} is not a program this agent runs")
    program_path = policy.programs[spec.program]
    env = _validate_environment(spec, policy)
    exec_bytes = _validate_argv(spec.argv)
    exec_bytes += sum(len(k) + len(v.encode("utf-8")) + 2 for k, v in env.items())
    if exec_bytes > MAX_EXEC_BYTES:
        raise LaunchRefused("argv", f"argv and environment exceed {MAX_EXEC_BYTES} bytes")
    _validate_material_files(spec.material_files)
    for name in ("memory_bytes", "cpu_millis"):
        value = getattr(spec, name)
        if not isinstance(value, int) or not 0 <= value <= MAX_QUANTITY:
            raise LaunchRefused(name, f"must be an integer in 0..{MAX_QUANTITY}")
    return ValidatedLaunch(
        spec=spec,
        uid=uid,
        gid=gid,
        home=home,
        program_path=program_path,
        environment=MappingProxyType(env),
    )
