"""Free text in a user's request: every string field of every user RPC (reasons, names,
ids, params, filters) is refused when it holds a control character, INVALID_ARGUMENT
naming the field, before the servicer sees it (rm_server/domain/text.py). Stored,
such text would reach other people's terminals and pages: a KillEngineConn reason
holding ``ESC ] 0 ; ... BEL ESC [ 2 J`` retitled and cleared the admin's terminal
running ``rmctl describe engineconn``.

The string fields of each message type are found from its descriptor once. Labels and
resources are left out: the domain checks them against patterns that admit no control
character, and they are most of an Apply (this costs an Apply about 3 µs; a walk of
every set field, as `service.wire` does for NUL characters when the bytes hold a zero,
about 25 µs). The agents' and EngineConns' RPCs are not
checked here: what they report (exit reasons, log tails of the user's program) is
stored as sent and shown with its control characters written out (rmctl, the
console), since a refused report would lose a state change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from rm_server.domain.text import check_free_text, short
from rm_server.service.plans import PlanCache

# Validated by the domain against patterns without control characters.
_SKIPPED_TYPES = frozenset({"labelrm.v1.Label", "labelrm.v1.Resource"})
# Fields that are written text, where line breaks and tabs are whitespace.
_MULTILINE = {"time_conditions_text": "\t\n\r"}
_NESTING = 4  # how deep sub-messages are looked into


@dataclass(frozen=True)
class _Plan:
    strings: tuple[str, ...]  # singular and repeated string fields
    maps: tuple[str, ...]  # map<string, string>
    messages: tuple[tuple[str, bool, _Plan], ...]  # (name, repeated, plan)

    @property
    def empty(self) -> bool:
        return not (self.strings or self.maps or self.messages)


_PLANS: dict[str, _Plan] = {}


def _string(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_STRING


def _plan(descriptor: Descriptor, depth: int = 0) -> _Plan:
    found = _PLANS.get(descriptor.full_name)
    if found is not None:
        return found
    strings, maps, messages = [], [], []
    for f in descriptor.fields:
        kind = f.message_type
        if kind is None:
            if _string(f):
                strings.append(f.name)
        elif kind.GetOptions().map_entry:
            key, value = kind.fields_by_name["key"], kind.fields_by_name["value"]
            if _string(key) and _string(value):
                maps.append(f.name)
        elif kind.full_name.startswith("labelrm.") and depth < _NESTING:
            inner = _plan(kind, depth + 1) if kind.full_name not in _SKIPPED_TYPES else None
            if inner is not None and not inner.empty:
                messages.append((f.name, f.is_repeated, inner))
    plan = _Plan(tuple(strings), tuple(maps), tuple(messages))
    _PLANS[descriptor.full_name] = plan
    return plan


_PLANS_OF_TYPES = PlanCache(_plan)


def check_free_text_fields(request: Any) -> None:
    """A DomainError naming the field (INVALID_ARGUMENT) when a string field of
    `request` holds a control character; otherwise nothing."""
    plan = _PLANS_OF_TYPES.of(request)
    if plan is not None:
        _check(request, plan, "")


def _check(message: Any, plan: _Plan, prefix: str) -> None:
    for name in plan.strings:
        value = getattr(message, name)
        allowed = _MULTILINE.get(name, "")
        if isinstance(value, str):
            check_free_text(prefix + name, value, allowed)
        else:
            for i, item in enumerate(value):
                check_free_text(f"{prefix}{name}[{i}]", item, allowed)
    for name in plan.maps:
        for key, value in getattr(message, name).items():
            check_free_text(prefix + name, key)  # the key itself: not in the field path
            check_free_text(f"{prefix}{name}.{short(key)}", value)
    for name, repeated, inner in plan.messages:
        if repeated:
            for i, item in enumerate(getattr(message, name)):
                _check(item, inner, f"{prefix}{name}[{i}].")
        elif message.HasField(name):
            _check(getattr(message, name), inner, f"{prefix}{name}.")
