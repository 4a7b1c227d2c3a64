"""The engine plugin interface and the shared runtime plugin the built-in engines use.

An engine plugin has two jobs in the EngineConn start-up flow:

* the *resource factory* turns the request's params (strings from the wire) plus the RM's
  per-label defaults into the :class:`Resource` the RM locks on the ECM and the labels;
* the *launch builder* turns a :class:`LaunchContext` into the :class:`LaunchRequest` the ECM
  agent writes into ``launch.sh`` and runs as the user.

Everything that reaches the launch request is validated here, even though the agent validates
again: the agent is the last line of defence, not the only one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from labelrm_common.launch import MaterialFile
from labelrm_common.quantity import parse_cpu, parse_memory
from rm_server.domain.errors import DomainError
from rm_server.domain.labels import Label
from rm_server.domain.resources import Resource


class InvalidParam(DomainError):
    """An invalid engine param or launch input; ``field`` is e.g. ``params.memory_bytes``
    (the request's field: INVALID_ARGUMENT naming it, rm_server/service/errors.py)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field)


@dataclass(frozen=True)
class LaunchContext:
    """What the launch builder needs to know about the EngineConn being started.

    ``params`` should be the *effective* params (see :func:`effective_params`), so that the
    per-label defaults the resource was computed from also reach the launched process.
    """

    ec_id: str
    user: str
    engine: str
    version: str
    labels: tuple[Label, ...]
    params: Mapping[str, str]


@dataclass(frozen=True)
class LaunchRequest:
    """Mirror of the EngineConnLaunchRequest proto message, without protobuf."""

    program: str
    argv: tuple[str, ...]
    environment: Mapping[str, str]
    required_local_environment: tuple[str, ...]
    material_files: tuple[MaterialFile, ...]


class EnginePlugin(Protocol):
    """An engine type; ``name`` is the type part of the engineType label (``shell``)."""

    @property
    def name(self) -> str: ...

    def resource(self, params: Mapping[str, str], defaults: Mapping[str, str]) -> Resource:
        """The resource factory: what one EngineConn of this engine needs."""
        ...

    def params(self, params: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
        """The effective params (every param this engine knows, as wire strings)."""
        ...

    def launch(self, ctx: LaunchContext) -> LaunchRequest:
        """The launch builder: the command the ECM agent runs."""
        ...


@dataclass(frozen=True)
class IntParam:
    """A positive integer param with a default and inclusive bounds."""

    name: str
    default: int
    minimum: int
    maximum: int


MEMORY_BYTES = IntParam("memory_bytes", 256 * 2**20, 1, 2**40)  # up to 1 TiB
CPU_MILLIS = IntParam("cpu_millis", 500, 1, 1024 * 1000)  # up to 1024 cores
MAX_IDLE_SECONDS = IntParam("max_idle_seconds", 600, 1, 7 * 24 * 3600)  # up to a week
PARAMS: Mapping[str, IntParam] = MappingProxyType(
    {p.name: p for p in (MEMORY_BYTES, CPU_MILLIS, MAX_IDLE_SECONDS)}
)

# Plain ASCII digits only: int() would also accept " 12", "1_000", "+5" and non-ASCII digits.
# 19 digits bounds the parse; the real bounds come from IntParam.
_DIGITS_RE = re.compile(r"[0-9]{1,19}")
_QUANTITY_MAX = 32  # characters of a quantity ("1.5Gi"): a longer value is not one
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_EC_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_VERSION_RE = re.compile(r"[A-Za-z0-9._]{1,64}")


def _parse(spec: IntParam, raw: object, field: str) -> int:
    if not isinstance(raw, str):
        raise InvalidParam(field, f"must be a string, got {type(raw).__name__}")
    value = _number(spec.name, raw, field)
    if not spec.minimum <= value <= spec.maximum:
        raise InvalidParam(field, f"{value} is outside {spec.minimum}..{spec.maximum}")
    return value


def _number(name: str, raw: str, field: str) -> int:
    """A param's value: a plain decimal number in the unit its name says (bytes,
    millicores, seconds, a count), or, for an amount, the quantity people write
    (labelrm_common/quantity.py, as rmctl's --memory and --cpu): ``512Mi`` for a
    ``*_bytes`` param, ``500m`` for a ``*_millis`` one."""
    if _DIGITS_RE.fullmatch(raw):
        return int(raw)
    short = raw[:32]
    # Plain ASCII as written, nothing around it: the quantity parser strips blanks and
    # its \d takes any script's digits.
    plain = len(raw) <= _QUANTITY_MAX and raw.isascii() and raw == raw.strip()
    if plain and name.endswith("_bytes"):
        try:
            return parse_memory(raw)
        except ValueError:
            pass
        raise InvalidParam(field, f"{short!r} is not an amount of memory: 512Mi, 2Gi, 1G or bytes")
    if plain and name.endswith("_millis"):
        if raw.endswith("m"):
            try:
                return parse_cpu(raw)
            except ValueError:
                pass
        # "0.5" would be cores: the name says millicores, so only 500 or 500m.
        raise InvalidParam(field, f"{short!r} is not an amount of CPU in millicores: 500 or 500m")
    raise InvalidParam(field, f"{short!r} is not a non-negative decimal integer")


def _check_known(values: Mapping[str, str], prefix: str, specs: Mapping[str, IntParam]) -> None:
    for name in sorted(values, key=str):
        if name not in specs:
            # The name comes from the wire: quote anything odd so it cannot forge log lines.
            shown = name if _NAME_RE.fullmatch(str(name)) else repr(str(name)[:64])
            known = ", ".join(sorted(specs))
            raise InvalidParam(f"{prefix}.{shown}", f"unknown param; known: {known}")


def resolve_params(
    params: Mapping[str, str], defaults: Mapping[str, str], specs: Mapping[str, IntParam] = PARAMS
) -> dict[str, int]:
    """Every param as an int: explicit ``params`` over per-label ``defaults`` over built-ins.

    Unknown names are refused in both mappings: a typo in the RM's defaults would otherwise be
    silently ignored (fields ``params.<name>`` / ``defaults.<name>``).
    """
    _check_known(defaults, "defaults", specs)
    _check_known(params, "params", specs)
    out: dict[str, int] = {}
    for name, spec in specs.items():
        if name in params:
            out[name] = _parse(spec, params[name], f"params.{name}")
        elif name in defaults:
            out[name] = _parse(spec, defaults[name], f"defaults.{name}")
        else:
            out[name] = spec.default
    return out


def effective_params(
    params: Mapping[str, str], defaults: Mapping[str, str], specs: Mapping[str, IntParam] = PARAMS
) -> dict[str, str]:
    """:func:`resolve_params` as wire strings, for storing and for :class:`LaunchContext`."""
    return {name: str(value) for name, value in resolve_params(params, defaults, specs).items()}


@dataclass(frozen=True)
class RuntimeEnginePlugin:
    """An engine run by the labelrm ``engineconn`` runtime (``python -m engineconn``).

    The runtime implements the engine itself, so a built-in engine differs only in its name.
    """

    name: str

    def resource(self, params: Mapping[str, str], defaults: Mapping[str, str]) -> Resource:
        """``load_instance(memory_bytes, cpu_millis, 1)``: one process of the given size."""
        values = resolve_params(params, defaults)
        return Resource.load_instance(values[MEMORY_BYTES.name], values[CPU_MILLIS.name], 1)

    def params(self, params: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
        """The built-in params (memory, CPU, idle time) with defaults filled in."""
        return effective_params(params, defaults)

    def launch(self, ctx: LaunchContext) -> LaunchRequest:
        """``python -m engineconn --ec-id ID --engine NAME --max-idle-seconds N --label k=v...``."""
        if ctx.engine != self.name:
            raise InvalidParam("labels", f"engine {ctx.engine!r} given to the {self.name} plugin")
        if not isinstance(ctx.ec_id, str) or not _EC_ID_RE.fullmatch(ctx.ec_id):
            raise InvalidParam("ec_id", f"invalid EngineConn id {str(ctx.ec_id)[:32]!r}")
        if not isinstance(ctx.version, str) or not _VERSION_RE.fullmatch(ctx.version):
            raise InvalidParam("labels", f"invalid engine version {str(ctx.version)[:32]!r}")
        values = resolve_params(ctx.params, {})
        argv: list[str] = [
            "-m",
            "engineconn",
            "--ec-id",
            ctx.ec_id,
            "--engine",
            self.name,
            "--max-idle-seconds",
            str(values[MAX_IDLE_SECONDS.name]),
        ]
        for i, label in enumerate(ctx.labels):
            # Label validates its characters (no whitespace, no newline) on construction.
            if not isinstance(label, Label):
                raise InvalidParam(f"labels[{i}]", f"expected a Label, got {type(label).__name__}")
            argv += ["--label", str(label)]
        return LaunchRequest(
            program="python",
            argv=tuple(argv),
            environment=MappingProxyType({"LABELRM_ENGINE_VERSION": ctx.version}),
            # The agent supplies the RM address from its own settings: the RM's view of its own
            # address may not be reachable from the ECM's network.
            required_local_environment=("LABELRM_RM",),
            material_files=(),
        )
