"""The fork server's line protocol, written once for both of its ends: the ECM agent
(``ecm_agent/forkserver.py``) and the fork server itself (``engineconn/forkserver.py``),
which import neither each other nor anything else of one another.

One JSON object per line:

    agent -> server   {"spawn": ID, "cwd": DIR, "argv": [ARG, ...], "env": {NAME: VALUE},
                       "hold": BOOL}
                      {"go": PID}                       a held child may run now
    server -> agent   {"ready": PID, "hold": true}      once, everything imported
                      {"spawned": ID, "pid": PID}       the child runs (or, held, waits for
                                                        its "go"), in its own session
                      {"failed": ID, "error": TEXT}     nothing of that launch runs
                      {"exit": PID, "status": STATUS, "cpu_ms": MS}
                                                        a child ended (STATUS as from wait)

Each side decodes what the other sends into these values and refuses anything else
(`WireError`): neither trusts the other's lines (the server is the user's process)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class WireError(ValueError):
    """A line that is not a message of the protocol."""


@dataclass(frozen=True)
class Spawn:
    """Fork EngineConn `ec_id` in `cwd` with `argv` and `env` (held: until its Go)."""

    ec_id: str
    cwd: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    hold: bool = False


@dataclass(frozen=True)
class Go:
    """Held child `pid` may run now (the agent has contained it)."""

    pid: int


@dataclass(frozen=True)
class Ready:
    """The server `pid` is ready (`hold`: it understands Spawn's hold and Go)."""

    pid: int
    hold: bool


@dataclass(frozen=True)
class Spawned:
    ec_id: str
    pid: int


@dataclass(frozen=True)
class Failed:
    """Nothing of launch `ec_id` runs ("" when the request could not be read)."""

    ec_id: str
    error: str


@dataclass(frozen=True)
class Exit:
    """Child `pid` ended with wait `status`, having used `cpu_ms` of CPU."""

    pid: int
    status: int
    cpu_ms: float = 0.0


Request = Spawn | Go
Reply = Ready | Spawned | Failed | Exit


def encode(message: Request | Reply) -> bytes:
    """The message as one line."""
    data: dict[str, Any]
    match message:
        case Spawn():
            data = {
                "spawn": message.ec_id,
                "cwd": message.cwd,
                "argv": list(message.argv),
                "env": dict(message.env),
                "hold": message.hold,
            }
        case Go():
            data = {"go": message.pid}
        case Ready():
            data = {"ready": message.pid, "hold": message.hold}
        case Spawned():
            data = {"spawned": message.ec_id, "pid": message.pid}
        case Failed():
            data = {"failed": message.ec_id, "error": message.error}
        case Exit():
            data = {"exit": message.pid, "status": message.status, "cpu_ms": message.cpu_ms}
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def decode_request(line: bytes) -> Request:
    """What the agent sent; WireError for anything else."""
    data = _object(line)
    if "go" in data:
        return Go(_int(data, "go"))
    argv, env = data.get("argv"), data.get("env")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise WireError("spawn: argv must be a list of strings")
    if not (
        isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise WireError("spawn: env must map strings to strings")
    return Spawn(_str(data, "spawn"), _str(data, "cwd"), tuple(argv), env, data.get("hold") is True)


def decode_reply(line: bytes) -> Reply:
    """What the server sent; WireError for anything else."""
    data = _object(line)
    if "exit" in data:
        cpu = data.get("cpu_ms", 0.0)
        return Exit(_int(data, "exit"), _int(data, "status"), float(cpu) if _number(cpu) else 0.0)
    if "spawned" in data:
        return Spawned(_str(data, "spawned"), _int(data, "pid"))
    if "failed" in data:
        return Failed(_str(data, "failed"), str(data.get("error", ""))[:4000])
    if "ready" in data:
        return Ready(_int(data, "ready"), data.get("hold") is True)
    raise WireError("not a message of the fork server's protocol")


def _object(line: bytes) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WireError("not an object")
    return data


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"{key}: an integer is needed")
    return value


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise WireError(f"{key}: a string is needed")
    return value


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
