"""Labels, their validation, and the transform from request labels to resource-carrying keys.

Label values end up in database keys, log lines and limit patterns, so the character set is
deliberately small: no '=' or ',' (they delimit serialised keys), no whitespace, no '*' (reserved
for limit patterns).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rm_server.domain.errors import DomainError
from rm_server.domain.text import clip

MAX_LABEL_LENGTH = 256
MAX_LABELS = 32
MAX_KEY_LENGTH = 64  # what KEY_RE allows

USER_CREATOR = "userCreator"
ENGINE_TYPE = "engineType"
EM_INSTANCE = "emInstance"
EC_INSTANCE = "ecInstance"

# Shared with limits.py so pattern keys follow exactly the same rules.
KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_VALUE_RE = re.compile(r"[A-Za-z0-9_.:@/+-]+")
_USER_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
_CREATOR_RE = re.compile(r"[A-Za-z0-9_.]+")
_ENGINE_RE = re.compile(r"[a-z][a-z0-9_]*")
_VERSION_RE = re.compile(r"[A-Za-z0-9._]+")
_INSTANCE_RE = re.compile(r"[A-Za-z0-9_.-]+(?::([0-9]{1,5}))?")


class LabelError(DomainError):
    """Invalid label input; ``field`` is a path such as ``labels[2].value`` (the functions
    that take a ``field`` prefix it to their own paths, so a request's labels checked as
    ``labels[i]`` name the request field itself)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field)


def _join_field(prefix: str, field: str) -> str:
    if not prefix:
        return field
    return f"{prefix}.{field}" if field else prefix


def check_key(key: object, field: str = "key") -> str:
    """Validate a label key and return it; LabelError naming ``field`` otherwise."""
    if not isinstance(key, str):
        raise LabelError(field, f"must be a string, got {type(key).__name__}")
    # fullmatch, not match + '$': '$' would accept a trailing newline.
    if not KEY_RE.fullmatch(key):
        raise LabelError(
            field, f"invalid label key {clip(key)}: expected [A-Za-z][A-Za-z0-9_.-]{{0,63}}"
        )
    return key


def _check_known_value(key: str, value: str) -> None:
    """Stricter checks for keys whose value the manager interprets."""
    if key == USER_CREATOR:
        user, sep, creator = value.rpartition("-")
        if not sep or not _USER_RE.fullmatch(user) or not _CREATOR_RE.fullmatch(creator):
            raise LabelError(
                "value", f"invalid {key} {clip(value)}: expected 'user-creator' (e.g. 'alice-IDE')"
            )
    elif key == ENGINE_TYPE:
        engine, sep, version = value.partition("-")
        if not sep or not _ENGINE_RE.fullmatch(engine) or not _VERSION_RE.fullmatch(version):
            raise LabelError(
                "value",
                f"invalid {key} {clip(value)}: expected 'type-version' (e.g. 'spark-3.2.1')",
            )
    elif key in (EM_INSTANCE, EC_INSTANCE):
        m = _INSTANCE_RE.fullmatch(value)
        port = m.group(1) if m else None
        if m is None or (port is not None and not 1 <= int(port) <= 65535):
            raise LabelError(
                "value",
                f"invalid {key} {clip(value)}: expected 'host' or 'host:port' (port 1..65535)",
            )


@dataclass(frozen=True, order=True)
class Label:
    """A validated ``key=value`` label."""

    key: str
    value: str

    def __post_init__(self) -> None:
        check_key(self.key, "key")
        if not isinstance(self.value, str):
            raise LabelError("value", f"must be a string, got {type(self.value).__name__}")
        if not self.value:
            raise LabelError("value", f"label {self.key!r} has an empty value")
        if len(self.key) + 1 + len(self.value) > MAX_LABEL_LENGTH:  # before any regex
            raise LabelError("", f"label {self.key!r} is longer than {MAX_LABEL_LENGTH} characters")
        if not _VALUE_RE.fullmatch(self.value):
            raise LabelError(
                "value",
                f"invalid value {clip(self.value)} for {self.key!r}: allowed characters are "
                "A-Z a-z 0-9 _ . : @ / + -",
            )
        _check_known_value(self.key, self.value)

    def __str__(self) -> str:
        return f"{self.key}={self.value}"

    @classmethod
    def parse(cls, text: str, field: str = "") -> Label:
        """Parse ``"key=value"`` (split at the first '='); LabelError naming ``field``."""
        if not isinstance(text, str):
            raise LabelError(field, f"label must be a string, got {type(text).__name__}")
        key, sep, value = text.partition("=")
        if not sep:
            raise LabelError(field, f"label {clip(text)} is not of the form key=value")
        return make_label(key, value, field)

    def _expect(self, key: str) -> None:
        if self.key != key:
            raise LabelError("key", f"label {self.key!r} is not a {key} label")

    @property
    def user(self) -> str:
        """User part of a userCreator label."""
        self._expect(USER_CREATOR)
        return self.value.rpartition("-")[0]

    @property
    def creator(self) -> str:
        """Creator part of a userCreator label (after the last '-')."""
        self._expect(USER_CREATOR)
        return self.value.rpartition("-")[2]

    @property
    def engine(self) -> str:
        """Engine type of an engineType label (before the first '-')."""
        self._expect(ENGINE_TYPE)
        return self.value.partition("-")[0]

    @property
    def version(self) -> str:
        """Engine version of an engineType label (after the first '-')."""
        self._expect(ENGINE_TYPE)
        return self.value.partition("-")[2]


def make_label(key: object, value: object, field: str = "") -> Label:
    """Build a Label; errors name ``field`` as prefix (``labels[3]`` -> ``labels[3].value``)."""
    try:
        return Label(key, value)  # type: ignore[arg-type]  # validated in __post_init__
    except LabelError as exc:
        raise LabelError(_join_field(field, exc.field), exc.message) from None


def validate_labels(labels: Sequence[Label], max_labels: int = MAX_LABELS) -> dict[str, Label]:
    """Index labels by key; LabelError on too many labels or duplicate keys."""
    if len(labels) > max_labels:
        raise LabelError("labels", f"too many labels: {len(labels)} > {max_labels}")
    out: dict[str, Label] = {}
    for i, label in enumerate(labels):
        if not isinstance(label, Label):
            raise LabelError(f"labels[{i}]", f"expected a Label, got {type(label).__name__}")
        if label.key in out:
            raise LabelError(f"labels[{i}].key", f"duplicate label key {label.key!r}")
        out[label.key] = label
    return out


@dataclass(frozen=True)
class LabelKey:
    """A resource-carrying key: one label or a combination, in the rule's key order."""

    labels: tuple[Label, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.labels, tuple) or not self.labels:
            raise LabelError("labels", "a label key needs at least one label")
        seen: set[str] = set()
        for i, label in enumerate(self.labels):
            if not isinstance(label, Label):
                raise LabelError(f"labels[{i}]", f"expected a Label, got {type(label).__name__}")
            if label.key in seen:
                raise LabelError(f"labels[{i}].key", f"duplicate label key {label.key!r}")
            seen.add(label.key)

    def __str__(self) -> str:
        return ",".join(str(label) for label in self.labels)

    @classmethod
    def parse(cls, text: str, field: str = "") -> LabelKey:
        """Inverse of ``str``: ``"userCreator=alice-IDE,engineType=spark-3.2.1"``."""
        if not isinstance(text, str) or not text:
            raise LabelError(field, "label key must be a non-empty string")
        parts = text.split(",")
        labels = tuple(
            Label.parse(part, _join_field(field, f"labels[{i}]")) for i, part in enumerate(parts)
        )
        try:
            return cls(labels)
        except LabelError as exc:
            raise LabelError(_join_field(field, exc.field), exc.message) from None

    def keys(self) -> tuple[str, ...]:
        """The label keys, in order."""
        return tuple(label.key for label in self.labels)


@dataclass(frozen=True)
class TransformRule:
    """Emit a LabelKey combining ``keys`` (in this order) when all are present in a request."""

    keys: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.keys, tuple) or not self.keys:
            raise LabelError("keys", "a transform rule needs at least one key")
        for i, key in enumerate(self.keys):
            check_key(key, f"keys[{i}]")
        if len(set(self.keys)) != len(self.keys):
            raise LabelError("keys", f"duplicate key in transform rule {'+'.join(self.keys)!r}")


DEFAULT_RULES: tuple[TransformRule, ...] = (
    TransformRule((USER_CREATOR, ENGINE_TYPE)),
    TransformRule((EM_INSTANCE,)),
)


def ecm_instance(key: str) -> str | None:
    """The ECM instance a resource-carrying label key names (``emInstance=host:port``
    alone: an ECM's own record), else None."""
    prefix = EM_INSTANCE + "="
    if key.startswith(prefix) and "," not in key:
        return key[len(prefix) :]
    return None


def parse_rules(spec: str) -> tuple[TransformRule, ...]:
    """Parse ``"userCreator+engineType;emInstance;tenant"``: rules split by ';', keys by '+'.

    Whitespace around items and empty rules (e.g. a trailing ';') are ignored; an empty key
    ("a++b") or a repeated rule is an error.
    """
    rules: list[TransformRule] = []
    for i, chunk in enumerate(spec.split(";")):
        chunk = chunk.strip()
        if not chunk:
            continue
        keys = tuple(k.strip() for k in chunk.split("+"))
        try:
            rule = TransformRule(keys)
        except LabelError as exc:
            raise LabelError(_join_field(f"rules[{i}]", exc.field), exc.message) from None
        if rule in rules:
            raise LabelError(f"rules[{i}]", f"duplicate transform rule {chunk!r}")
        rules.append(rule)
    return tuple(rules)


def transform(
    labels: Mapping[str, Label] | Sequence[Label],
    rules: Sequence[TransformRule] = DEFAULT_RULES,
) -> tuple[LabelKey, ...]:
    """The resource-carrying label keys of a request, deduplicated and sorted by ``str(key)``.

    The sort order is the canonical row-lock order: every transaction locks resource rows in this
    order, which is what prevents deadlocks between concurrent requests.
    """
    if isinstance(labels, Mapping):
        by_key = dict(labels)
        for k, label in by_key.items():
            if not isinstance(label, Label) or label.key != k:
                raise LabelError(f"labels[{k!r}]", "mapping key does not match the label key")
    else:
        by_key = validate_labels(labels)
    keys: set[LabelKey] = set()
    for rule in rules:
        if all(k in by_key for k in rule.keys):
            keys.add(LabelKey(tuple(by_key[k] for k in rule.keys)))
    return tuple(sorted(keys, key=str))


def charges_user(
    labels: Sequence[Label], user: str, rules: Sequence[TransformRule] = DEFAULT_RULES
) -> bool:
    """True when one of the request's resource-carrying keys is `user`'s own (carries
    their userCreator label), so that the limits set for that user apply to it. A request
    on infrastructure labels alone (emInstance) charges no user at all."""
    return any(
        label.key == USER_CREATOR and label.user == user
        for key in transform(labels, rules)
        for label in key.labels
    )


def user_rule_keys(rules: Sequence[TransformRule] = DEFAULT_RULES) -> list[str]:
    """The label combinations that charge a user ("userCreator+engineType"), for messages."""
    return ["+".join(rule.keys) for rule in rules if USER_CREATOR in rule.keys]
