"""One settings loader for rm-server, ecm-agent and the EngineConn runtime.

A program declares its settings once, as the fields of a frozen dataclass made with
`Section.setting` (type, default, description, environment variable, flag, config-file key,
validation), and describes itself with a `Program`. Everything else comes from that one
declaration: the command line and its `--help`, the precedence (defaults < TOML config
file < environment < flags, each source only where the program has it), `--print-config`
(the effective settings as TOML with the source of each value, secrets redacted), the
tables of docs/configuration.md, and the errors: every bad value, unknown key or unreadable
file is a `SettingsError` whose text names the setting and where it came from, printed as
one line ``PROG: error: MESSAGE`` with exit code 2 (`load_or_exit`, `error_exit_code`).

The settings dataclasses stay flat (``settings.tls_cert``): sections group the settings in
`--help`, `--print-config` and the documentation without changing a name, a key or a flag.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, NoReturn, TypeVar

__all__ = [
    "Loaded",
    "Program",
    "Section",
    "SettingsError",
    "error_exit_code",
    "load",
    "load_or_exit",
    "redact_url",
]

T = TypeVar("T")
S = TypeVar("S")

Check = Callable[[Any], str | None]
"""A validation: the value in, an error text (which completes "NAME ...") or None out."""


class SettingsError(ValueError):
    """A setting that cannot be used: the program prints it as one line and exits 2."""


@dataclass(frozen=True)
class Meta:
    """What `Section.setting` records of one setting (the dataclass field's metadata)."""

    help: str
    section: Section
    env: str | bool  # True: PREFIX + NAME; False: none; else the variable's name
    flag: str | bool  # True: --name-with-dashes; False: none; else the flag
    file: bool  # may be set in the config file
    secret: bool  # never shown: --print-config prints ***, and never a flag
    required: bool  # an empty value is an error
    redact: Callable[[Any], str] | None  # what --print-config shows instead (secret=False)
    choices: tuple[str, ...]
    check: Check | None
    doc_default: str  # the docs' default column, where the value itself would mislead
    also_from: tuple[str, ...]  # other sources of a secret, named when a flag is refused


@dataclass(frozen=True)
class Section:
    """A group of settings (listeners, database, TLS...) in the help, output and docs."""

    name: str
    title: str

    def setting(
        self,
        default: T,
        help: str,
        *,
        env: str | bool = True,
        flag: str | bool = True,
        file: bool = True,
        secret: bool = False,
        required: bool = False,
        redact: Callable[[Any], str] | None = None,
        choices: Sequence[str] = (),
        check: Check | None = None,
        doc_default: str = "",
        also_from: Sequence[str] = (),
    ) -> T:
        """A settings dataclass field: `default` and its type's parser, `help` (the flag's
        --help, --print-config's and the docs' text), the environment variable (`env`:
        True for the program's prefix + NAME), the flag (True for --name-with-dashes) and
        whether the config file may set it. `secret`: never printed, never a flag (a flag
        shows in `ps` to every local user). `choices`/`check`: validation of a value given
        (defaults are not checked); `required`: an empty value is an error."""
        meta = Meta(
            help=help,
            section=self,
            env=env,
            flag=flag,
            file=file,
            secret=secret,
            required=required,
            redact=redact,
            choices=tuple(choices),
            check=check,
            doc_default=doc_default,
            also_from=tuple(also_from),
        )
        # repr=False keeps a secret out of every log line that shows the settings.
        made: T = field(default=default, repr=not secret, metadata={"setting": meta})
        return made


@dataclass(frozen=True)
class Spec:
    """One setting as the loader sees it: names resolved, parser chosen."""

    name: str
    kind: Any  # str, int, float, bool, Path or tuple (of str)
    default: Any
    env: str  # "" : none
    flag: str  # "" : none
    key: str  # in the config file; "" : none
    meta: Meta

    @property
    def refused_flag(self) -> str:
        """The flag of a secret refused on the command line, else `flag`."""
        return self.flag or "--" + self.name.replace("_", "-")

    def parse(self, raw: Any) -> Any:
        """`raw` (a TOML value, an environment string or a flag's text) as the setting's
        type; ValueError or TypeError when it is not one."""
        if self.kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"not a boolean: {raw!r}")
            return text in ("true", "1", "yes")
        if self.kind is tuple:  # a list: a TOML array, repeated flags, or "a,b" text
            if isinstance(raw, list | tuple):
                return tuple(str(item) for item in raw)
            return tuple(part for part in str(raw).split(",") if part)
        if self.kind is Path:
            return Path(raw)
        if self.kind in (int, float):
            if isinstance(raw, bool):  # TOML `true` is no number
                raise ValueError(f"not a number: {raw!r}")
            return self.kind(raw)
        return str(raw)

    def validate(self, value: Any) -> str | None:
        """The error text of an unusable value ("NAME must..."), else None."""
        if self.meta.choices and value not in self.meta.choices:
            return f"{self.name} must be one of {', '.join(self.meta.choices)}, not {value!r}"
        if self.meta.check is not None:
            problem = self.meta.check(value)
            if problem:
                return f"{self.name} {problem}"
        return None

    def shown(self, value: Any) -> Any:
        """The value as --print-config shows it: secrets as ***, a redaction applied."""
        if self.meta.secret:
            return "***" if value else ""
        if self.meta.redact is not None:
            return self.meta.redact(value)
        return value


def _kind(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple
    if hint in (str, int, float, bool, Path):
        return hint
    raise TypeError(f"no settings parser for {hint!r}")


@dataclass(frozen=True)
class Program(Generic[S]):
    """A program that loads settings: its name, its settings class and its sources."""

    prog: str  # in --help, --version and every error line
    settings: type[S]  # the frozen dataclass of `Section.setting` fields
    description: str
    version: str
    env_prefix: str  # of the settings' environment variables (env=True)
    config_file: bool = True  # --config FILE (TOML, keys: the setting names) exists
    config_env: str = ""  # also names the config file (e.g. LABELRM_CONFIG)
    switches: tuple[tuple[str, str], ...] = ()  # (--flag, help): modes, not settings
    # Checks across settings and derived values (the values by name, where each came
    # from); raises SettingsError.
    finish: Callable[[dict[str, Any], Mapping[str, str]], None] | None = None

    @cached_property
    def specs(self) -> tuple[Spec, ...]:
        """Every setting of `settings`, in declaration order."""
        hints = typing.get_type_hints(self.settings)
        out = []
        for f in fields(typing.cast(Any, self.settings)):
            meta = f.metadata.get("setting")
            if not isinstance(meta, Meta) or not meta.help:
                raise TypeError(f"{self.settings.__name__}.{f.name} is no described setting")
            env = self.env_prefix + f.name.upper() if meta.env is True else meta.env or ""
            flag = "--" + f.name.replace("_", "-") if meta.flag is True else meta.flag or ""
            if meta.secret:
                flag = ""
            key = f.name if meta.file and self.config_file else ""
            kind = _kind(hints[f.name])
            out.append(Spec(f.name, kind, _default(f), env, flag, key, meta))
        return tuple(out)

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources, lowest precedence first."""
        return (
            ("default", "file", "env", "flag") if self.config_file else ("default", "env", "flag")
        )

    @cached_property
    def parser(self) -> argparse.ArgumentParser:
        """`build_parser`, built once and reused: building it costs more than a parse
        (an EngineConn forked from a warm fork server, which built it, pays only the
        parse)."""
        return self.build_parser()

    def build_parser(self) -> argparse.ArgumentParser:
        """The command line: one flag per setting with its description, by section."""
        parser = _Parser(
            prog=self.prog,
            description=f"{self.description} Settings: {' < '.join(self._source_names())}.",
        )
        parser.add_argument("--version", action="version", version=f"{self.prog} {self.version}")
        if self.config_file:
            where = f" [{self.config_env}]" if self.config_env else ""
            parser.add_argument(
                "--config", help=f"TOML file with settings (keys: the setting names){where}"
            )
        parser.add_argument(
            "--print-config",
            action="store_true",
            help="print the effective configuration with the source of each value, and exit",
        )
        for flag, text in self.switches:
            parser.add_argument(flag, action="store_true", help=text)
        groups: dict[str, argparse._ArgumentGroup] = {}
        for spec in self.specs:
            if spec.meta.secret:  # refused with a clear error, not "unrecognized"
                hidden = f"_refused_{spec.name}"
                parser.add_argument(spec.refused_flag, dest=hidden, help=argparse.SUPPRESS)
                continue
            if not spec.flag:
                continue
            section = spec.meta.section
            if section.name not in groups:
                groups[section.name] = parser.add_argument_group(section.title)
            group = groups[section.name]
            text = f"{spec.meta.help} [{spec.env}]" if spec.env else spec.meta.help
            if spec.kind is bool:  # a switch: `--insecure`
                group.add_argument(
                    spec.flag, dest=spec.name, action="store_const", const=True, help=text
                )
            else:
                group.add_argument(
                    spec.flag,
                    dest=spec.name,
                    action="append" if spec.kind is tuple else "store",
                    metavar=spec.flag[2:].replace("-", "_").upper(),
                    help=text,
                )
        return parser

    def _source_names(self) -> list[str]:
        names = ["defaults"]
        if self.config_file:
            names.append("--config TOML" + (f" (or {self.config_env})" if self.config_env else ""))
        names += [f"{self.env_prefix}<NAME> environment", "flags"]
        return names


class _Parser(argparse.ArgumentParser):
    """Command-line errors become SettingsError (one line, exit 2), not the usage text."""

    def error(self, message: str) -> NoReturn:
        """Raise `message` with a hint at --help."""
        raise SettingsError(f"{message} ({self.prog} --help lists the settings)")


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise TypeError(f"setting {f.name} has no default")


@dataclass(frozen=True)
class Loaded(Generic[S]):
    """The effective settings, where each came from, and what the command line asked."""

    program: Program[S]
    settings: S
    sources: dict[str, str] = field(default_factory=dict)  # name -> file, env or flag
    config_file: str = ""
    print_config: bool = False
    switches: Mapping[str, bool] = field(default_factory=dict)  # "dev" -> given

    def describe(self) -> str:
        """The effective configuration as TOML (valid as a config file), by section, each
        value commented with its source, environment variable and flag; secrets ***."""
        order = " < ".join(self.program.sources)
        lines = [f"# {self.program.prog} effective configuration (source: {order})"]
        if self.config_file:
            lines.append(f"# config file: {self.config_file}")
        section = None
        for spec in self.program.specs:
            if spec.meta.section is not section:
                section = spec.meta.section
                lines += ["", f"# --- {section.title}"]
            value = spec.shown(getattr(self.settings, spec.name))
            names = ", ".join(n for n in (spec.env, spec.flag) if n)
            source = self.sources.get(spec.name, "default")
            lines.append(
                f"{spec.name} = {_toml(value)}  # {source}" + (f" ({names})" * bool(names))
            )
        return "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def load(
    program: Program[S], argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Loaded[S]:
    """Parse the command line, the config file and the environment (`environ`, default
    os.environ) into the settings; SettingsError (one line) for anything unusable."""
    env = os.environ if environ is None else environ
    args = program.parser.parse_args(argv)
    by_name = {spec.name: spec for spec in program.specs}
    values: dict[str, Any] = {spec.name: spec.default for spec in program.specs}
    sources: dict[str, str] = {}
    where: dict[str, str] = {}

    for spec in program.specs:
        if spec.meta.secret and getattr(args, f"_refused_{spec.name}", None) is not None:
            raise SettingsError(_refused(spec))

    def put(spec: Spec, raw: Any, source: str, origin: str) -> None:
        try:
            values[spec.name] = spec.parse(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"invalid value {raw!r} for {spec.name} ({origin})") from None
        sources[spec.name] = source
        where[spec.name] = origin

    config_file = ""
    if program.config_file:
        config_file = args.config or (env.get(program.config_env, "") if program.config_env else "")
    if config_file:
        for key, raw in _read_toml(config_file).items():
            known = by_name.get(key.replace("-", "_"))
            if known is None or not known.key:
                raise SettingsError(f"unknown setting {key!r} in {config_file}")
            put(known, raw, "file", config_file)
    for spec in program.specs:
        if spec.env and (raw := env.get(spec.env)) is not None:
            put(spec, raw, "env", spec.env)
        if spec.flag and (raw := getattr(args, spec.name)) is not None:
            put(spec, raw, "flag", spec.flag)
    for spec in program.specs:
        problem = spec.validate(values[spec.name]) if spec.name in where else None
        if problem:
            raise SettingsError(f"{problem} ({where[spec.name]})")
        if spec.meta.required and not values[spec.name]:
            raise SettingsError(f"{spec.name} is required: set {_either(_ways(spec))}")
    if program.finish is not None:
        program.finish(values, sources)
    switches = {dest: bool(getattr(args, dest)) for dest in map(_dest, program.switches)}
    return Loaded(
        program, program.settings(**values), sources, config_file, bool(args.print_config), switches
    )


def _dest(switch: tuple[str, str]) -> str:
    return switch[0].lstrip("-").replace("-", "_")


def _ways(spec: Spec) -> list[str]:
    """Where `spec` may be set, for an error message."""
    return [w for w in (spec.flag, spec.env, spec.key and f"{spec.key} in the config file") if w]


def _refused(spec: Spec) -> str:
    ways = _either([*_ways(spec), *spec.meta.also_from])
    return f"{spec.refused_flag} would show the {spec.name} to every local user (ps): set {ways}"


def _either(ways: Sequence[str]) -> str:
    """ "a", "a or b", "a, b, or c"."""
    if len(ways) < 3:
        return " or ".join(ways)
    return ", ".join(ways[:-1]) + ", or " + ways[-1]


def _read_toml(path: str) -> dict[str, Any]:
    import tomllib  # only when there is a file: the EngineConn's start never pays for it

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}") from None


def error_exit_code(prog: str, exc: SettingsError) -> int:
    """Print `exc` as ``PROG: error: MESSAGE`` (one line) on stderr; the exit code, 2."""
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return 2


def load_or_exit(
    program: Program[S], argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Loaded[S]:
    """`load`, or the error line and SystemExit(2)."""
    try:
        return load(program, argv, environ)
    except SettingsError as exc:
        raise SystemExit(error_exit_code(program.prog, exc)) from None


def one_of_levels(value: Any) -> str | None:
    """A `check` for log levels (any case)."""
    levels = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    if str(value).upper() not in levels:
        return f"must be one of {', '.join(levels)}, not {value!r}"
    return None


def positive(value: Any) -> str | None:
    """A `check`: the value must be above 0."""
    return None if value > 0 else f"must be positive, not {value!r}"


def redact_url(url: str) -> str:
    """A database URL with its password (URL or key=value form) replaced by ***."""
    url = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url)


def markdown_table(program: Program[Any]) -> list[str]:
    """The docs' tables of `program`'s settings, one per section (docs/configuration.md)."""
    key = "setting / TOML key" if program.config_file else "setting"
    lines: list[str] = []
    section = None
    for spec in program.specs:
        if spec.meta.section is not section:
            section = spec.meta.section
            lines += [""] * bool(lines) + [f"#### {section.title}", ""]
            lines += [
                f"| {key} | default | environment | flag | meaning |",
                "|---|---|---|---|---|",
            ]
        env = f"`{spec.env}`" if spec.env else "—"
        flag = f"`{spec.flag}`" if spec.flag else "—"
        meaning = spec.meta.help.replace("|", "\\|")
        lines.append(f"| `{spec.name}` | {_doc_default(spec)} | {env} | {flag} | {meaning} |")
    return lines


def _doc_default(spec: Spec) -> str:
    if spec.meta.doc_default:
        return spec.meta.doc_default
    value = spec.default
    if value in ("", None, ()):
        return "empty"
    return f"`{_toml(value) if isinstance(value, bool) else value}`"
