"""Counts and sizes of a request, checked before any per-item work is done on it (the
access policy reads its labels, the servicer parses each one, resources become label
records): a request with 19,000 labels or 10,000 special dimensions is refused for the
price of a few `len` calls, and its refusal quotes none of the offending values whole.

What is checked, found from the message descriptors once per message type: every
repeated `Label` field (how many; each key's and value's length), every `Resource`
field (how many special dimensions; each name's length), and every other repeated or
map field (how many entries: at most `MAX_REPEATED`), in the request and in its
singular sub-messages (a HeartbeatStream message wraps its heartbeat). Counting is a
`len` on the parsed message: a heartbeat of two million empty reports is refused before
anything walks them (the NUL check of service.wire, the policy, the servicer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor

from rm_server.domain.labels import MAX_KEY_LENGTH, MAX_LABEL_LENGTH, MAX_LABELS
from rm_server.domain.resources import MAX_SPECIAL_DIMENSIONS, MAX_SPECIAL_NAME_LENGTH
from rm_server.domain.text import clip
from rm_server.errors import InvalidArgument
from rm_server.service.plans import PlanCache

LABEL_TYPE = "labelrm.v1.Label"
RESOURCE_TYPE = "labelrm.v1.Resource"
_NESTING = 3  # how deep singular sub-messages are looked into
# Entries of any other repeated or map field of a request: an agent reports each of its
# EngineConns in one heartbeat, and an operator's node list names each host; no request
# of ours needs more. (The servicers bound some further: params, intervals per AND/OR.)
MAX_REPEATED = 10_000


@dataclass(frozen=True)
class _Plan:
    labels: tuple[str, ...]  # repeated Label fields
    resources: tuple[str, ...]  # singular Resource fields
    nested: tuple[tuple[str, _Plan], ...]  # singular sub-messages with something to check
    counted: tuple[str, ...] = ()  # the other repeated and map fields

    @property
    def empty(self) -> bool:
        return not (self.labels or self.resources or self.nested or self.counted)


_PLANS: dict[str, _Plan] = {}


def _plan(descriptor: Descriptor, depth: int = 0) -> _Plan:
    found = _PLANS.get(descriptor.full_name)
    if found is not None:
        return found
    labels, resources, nested, counted = [], [], [], []
    for f in descriptor.fields:
        repeated = f.is_repeated
        if f.message_type is None:
            if repeated:
                counted.append(f.name)
            continue
        kind = f.message_type.full_name
        if kind == LABEL_TYPE and repeated:
            labels.append(f.name)
        elif repeated:
            counted.append(f.name)
        elif kind == RESOURCE_TYPE:
            resources.append(f.name)
        elif kind.startswith("labelrm.") and depth < _NESTING:
            inner = _plan(f.message_type, depth + 1)
            if not inner.empty:
                nested.append((f.name, inner))
    plan = _Plan(tuple(labels), tuple(resources), tuple(nested), tuple(counted))
    _PLANS[descriptor.full_name] = plan
    return plan


_PLANS_OF_TYPES = PlanCache(_plan)


def check_bounds(request: Any) -> None:
    """InvalidArgument naming the field when `request` has too many labels, special
    dimensions or entries of a repeated field, or a label or dimension name too long;
    otherwise nothing (and nothing else is looked at)."""
    plan = _PLANS_OF_TYPES.of(request)
    if plan is not None:
        _check(request, plan, "")


def _check(message: Any, plan: _Plan, prefix: str) -> None:
    for name in plan.counted:
        count = len(getattr(message, name))
        if count > MAX_REPEATED:
            raise InvalidArgument(prefix + name, f"too many entries: {count} > {MAX_REPEATED}")
    for name in plan.labels:
        _check_labels(getattr(message, name), prefix + name)
    for name in plan.resources:
        if message.HasField(name):
            _check_resource(getattr(message, name), prefix + name)
    for name, inner in plan.nested:
        if message.HasField(name):
            _check(getattr(message, name), inner, f"{prefix}{name}.")


def _check_labels(labels: Any, field: str) -> None:
    count = len(labels)
    if count > MAX_LABELS:
        raise InvalidArgument(field, f"too many labels: {count} > {MAX_LABELS}")
    for i, label in enumerate(labels):
        key, value = label.key, label.value
        if len(key) > MAX_KEY_LENGTH:
            raise InvalidArgument(
                f"{field}[{i}].key",
                f"label key of {len(key)} characters is longer than {MAX_KEY_LENGTH}: {clip(key)}",
            )
        if len(key) + 1 + len(value) > MAX_LABEL_LENGTH:
            raise InvalidArgument(
                f"{field}[{i}].value",
                f"label {key}=... of {len(key) + 1 + len(value)} characters is longer than"
                f" {MAX_LABEL_LENGTH}: {clip(value)}",
            )


def _check_resource(resource: Any, field: str) -> None:
    if resource.WhichOneof("kind") != "special":
        return
    quantities = resource.special.quantities
    count = len(quantities)
    if count > MAX_SPECIAL_DIMENSIONS:
        raise InvalidArgument(
            f"{field}.special.quantities",
            f"too many special dimensions: {count} > {MAX_SPECIAL_DIMENSIONS}",
        )
    for name in quantities:
        if len(name) > MAX_SPECIAL_NAME_LENGTH:
            raise InvalidArgument(
                f"{field}.special.quantities",
                f"special dimension name of {len(name)} characters is longer than"
                f" {MAX_SPECIAL_NAME_LENGTH}: {clip(name)}",
            )
