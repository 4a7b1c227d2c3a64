"""rmctl's argument types and list conventions: labels, quantities, label selectors,
repeatable case-insensitive states, --sort-by, and the signature of a command.

A filter value rmctl cannot match (an unknown state, a malformed selector, an ECM prefix
that names none) is an error, never a silently empty list.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, Protocol, TextIO, TypeAlias, TypeVar

from labelrm_client import RMClient, labels_from, load, load_instance
from labelrm_common.quantity import parse_cpu, parse_memory

__all__ = [
    "LOST_NODE_AGE_OUT",
    "Command",
    "Parser",
    "add_resource_args",
    "add_selector",
    "add_sort_by",
    "did_you_mean",
    "labels_arg",
    "matches",
    "non_negative",
    "parse_cores",
    "parse_duration",
    "parse_size",
    "resource_arg",
    "resource_dims",
    "resource_update",
    "rm_target",
    "selected",
    "selector_arg",
    "sort_rows",
    "state_arg",
]

Command: TypeAlias = Callable[[RMClient, argparse.Namespace, TextIO], int]
"""An RM command: ``(client, parsed arguments, stdout) -> exit code``."""


# --- the parser: one case rule, and "did you mean" ------------------------------------------

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<known>.*)\)")


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``; did you mean 'node'?`` for the known word closest to `word` ("" for none)."""
    close = difflib.get_close_matches(word.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class Parser(argparse.ArgumentParser):
    """rmctl's parsers (every subcommand's too): an unknown command or choice is answered
    with the closest known one, and every enumerated value is taken in any case (`--state
    ACCEPTED`, `-o JSON`), one rule for all of them."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        choices = kwargs.get("choices")
        if (
            choices is not None
            and "type" not in kwargs
            and all(isinstance(c, str) and c == c.lower() for c in choices)
        ):
            kwargs["type"] = str.lower
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        found = _INVALID_CHOICE.search(message)
        if found:
            known = re.findall(r"'([^']*)'", found.group("known"))
            message += did_you_mean(found.group("word"), known)
        super().error(message)


class _Labelled(Protocol):
    @property
    def labels(self) -> Iterable[Any]: ...


L = TypeVar("L", bound=_Labelled)

LOST_NODE_AGE_OUT = 3600.0
"""Seconds after its last heartbeat that a LOST node leaves `rmctl node list` (-A shows it)."""


# --- the RM's address --------------------------------------------------------------------

DEFAULT_PORT = 7100
"""The RM's port when an address names none (rm-server's default --listen)."""

_URL_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")


def rm_target(text: str) -> str:
    """The gRPC target of an RM address: HOST:PORT, HOST (the port is DEFAULT_PORT, not
    gRPC's 443), [IPv6]:PORT, or a gRPC target with its scheme (dns:, unix:, ...);
    ValueError for a URL, which gRPC would take for a host name."""
    text = text.strip()
    url = _URL_RE.match(text)
    if url:
        rest = text[url.end() :].rstrip("/")
        raise ValueError(
            f"the RM's address is HOST:PORT, not a URL: {text!r} (try {rest!r}"
            + ("; TLS is --tls-ca FILE" if url.group(1) == "https" else "")
            + ")"
        )
    if not text:
        raise ValueError("the RM's address is empty: give HOST:PORT")
    if text.startswith(_GRPC_SCHEMES):
        return text
    if text.startswith("["):  # [::1] or [::1]:7100
        return text if "]:" in text else f"{text}:{DEFAULT_PORT}"
    if text.count(":") > 1:  # a bare IPv6 address
        return f"[{text}]:{DEFAULT_PORT}"
    host, sep, port = text.partition(":")
    if not sep:
        return f"{host}:{DEFAULT_PORT}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the RM's address {text!r} has no valid port (1-65535)")
    return text


# --- labels and quantities -----------------------------------------------------------------


def labels_arg(text: str) -> list[Any]:
    """Label messages from "k=v,k2=v2" (at least one); an argparse error when malformed."""
    try:
        out = labels_from(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not out:
        raise argparse.ArgumentTypeError("at least one key=value label is required")
    return out


def parse_size(text: str) -> int:
    """Bytes from "536870912", "512Mi", "2Gi" (binary) or "1G" (decimal), Kubernetes style."""
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_cores(text: str) -> int:
    """Millicores from "500m" or "2" / "0.5" (cores), Kubernetes style."""
    try:
        return parse_cpu(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_DURATION_RE = re.compile(r"(?:(\d+(?:\.\d+)?)([dhms]))+|\d+(?:\.\d+)?")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> float:
    """Seconds from "90", "30s", "10m", "1h30m" or "2d" (Go's and kubectl's form, with
    days); an argparse error otherwise."""
    text = text.strip()
    if not _DURATION_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: expected e.g. 30s, 10m, 1h30m or seconds"
        )
    if text.replace(".", "", 1).isdigit():
        return float(text)
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART_RE.findall(text))


def non_negative(text: str) -> int:
    """An integer >= 0; an argparse error otherwise."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from exc
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def add_resource_args(c: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--memory``, ``--cpu`` and ``--instances``: a resource, read by `resource_arg`
    (both --memory and --cpu required) or, when not `required`, by `resource_update`."""
    c.add_argument(
        "--memory",
        type=parse_size,
        required=required,
        metavar="QUANTITY",
        help="512Mi, 2Gi (binary), 1G (decimal) or bytes",
    )
    c.add_argument("--cpu", type=parse_cores, required=required, metavar="QUANTITY",
                   help="cores (2, 0.5) or millicores (500m)")  # fmt: skip
    c.add_argument("--instances", type=non_negative, default=None, metavar="N")


def resource_arg(args: argparse.Namespace) -> Any:
    """The resource `add_resource_args` read: a load, or a load with instances."""
    if args.instances is None:
        return load(args.memory, args.cpu)
    return load_instance(args.memory, args.cpu, args.instances)


# Resource dimensions and the flags that give them.
_FLAGS = (("memory_bytes", "memory"), ("cpu_millis", "cpu"), ("instances", "instances"))


def resource_dims(resource: Any) -> dict[str, int]:
    """memory_bytes, cpu_millis and instances of a load or load_instance Resource message
    (empty for any other kind, or None)."""
    if resource is None or resource.WhichOneof("kind") not in ("load", "load_instance"):
        return {}
    inner = getattr(resource, str(resource.WhichOneof("kind")))
    names = {f.name for f in inner.DESCRIPTOR.fields}
    return {d: int(getattr(inner, d)) for d, _ in _FLAGS if d in names}


def resource_update(args: argparse.Namespace, current: Any, what: str) -> Any:
    """The resource the flags give over `current` (a Resource message or None): each
    dimension not given keeps its value there. None when no flag was given; ValueError
    naming the missing flags when `current` (`what`, for the message) has no value for
    them."""
    given = {d: getattr(args, flag) for d, flag in _FLAGS if getattr(args, flag) is not None}
    if not given:
        return None
    merged = {**resource_dims(current), **given}
    missing = [f"--{flag}" for d, flag in _FLAGS[:2] if d not in merged]
    if missing:
        raise ValueError(
            f"{what} has no {' or '.join(missing)} to keep: give {' and '.join(missing)}"
        )
    if "instances" in merged:
        return load_instance(merged["memory_bytes"], merged["cpu_millis"], merged["instances"])
    return load(merged["memory_bytes"], merged["cpu_millis"])


# --- selectors, states, sorting ------------------------------------------------------------


def selector_arg(text: str) -> list[tuple[str, str]]:
    """ "k=v,k2=v2" -> [(k, v), (k2, v2)]; an argparse error when malformed."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"selector {part!r} is not key=value")
        pairs.append((key.strip(), value.strip()))
    if not pairs:
        raise argparse.ArgumentTypeError("an empty selector: expected key=value[,key=value]")
    return pairs


def add_selector(parser: argparse.ArgumentParser) -> None:
    """`-l/--selector k=v,k2=v2` (repeatable: every pair must match, in any order)."""
    parser.add_argument(
        "-l",
        "--selector",
        action="extend",
        type=selector_arg,
        default=[],
        metavar="K=V[,K=V...]",
        help="only objects with all these labels (any order; repeatable)",
    )


def matches(labels: Iterable[Any], selector: Sequence[tuple[str, str]]) -> bool:
    """Whether label messages (key, value) carry every pair of `selector`."""
    have = {(lb.key, lb.value) for lb in labels}
    return all(pair in have for pair in selector)


def selected(items: Iterable[L], selector: Sequence[tuple[str, str]]) -> list[L]:
    """The items (messages with a ``labels`` field) whose labels carry every pair of
    `selector`, in their order."""
    return [item for item in items if matches(item.labels, selector)]


def state_arg(names: Iterable[str]) -> Callable[[str], str]:
    """An argparse type: a state name in any case ("IDLE", "idle", "Idle", with or without
    its enum's prefix), else an error listing the known ones and the closest."""
    known = sorted(names)

    def parse(text: str) -> str:
        name = text.strip().lower()
        for prefix in ("engine_conn_state_", "ecm_state_", "demand_state_", "ticket_state_"):
            name = name.removeprefix(prefix)
        if name not in known:
            raise argparse.ArgumentTypeError(
                f"unknown state {text!r}: expected one of {', '.join(known)}"
                + did_you_mean(name, known)
            )
        return name

    parse.names = known  # type: ignore[attr-defined]  # for shell completion
    return parse


def add_sort_by(parser: argparse.ArgumentParser, columns: Sequence[str]) -> None:
    """`--sort-by COLUMN` (a column name of the table, any case)."""
    parser.add_argument(
        "--sort-by",
        type=str.lower,
        choices=[c.lower() for c in columns],
        default=None,
        metavar="COLUMN",
        help=f"sort by a column: {', '.join(c.lower() for c in columns)}",
    )


def sort_rows(
    items: list[Any], column: str | None, keys: Mapping[str, Callable[[Any], Any]]
) -> list[Any]:
    """`items` sorted by the key of `column` (stable; unchanged without one)."""
    if column is None:
        return items
    return sorted(items, key=keys[column])
