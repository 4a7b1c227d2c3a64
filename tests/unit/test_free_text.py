"""Control characters: which ones, how they are written out for people, and the RM's
refusal of every string field of every user RPC."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import given
from hypothesis import strategies as st
from labelrm.v1 import admin_pb2, demand_pb2, engine_conn_pb2, resource_manager_pb2, usage_pb2

from labelrm_common.text import first_control, visible
from rm_server.domain.errors import DomainError
from rm_server.security import policy
from rm_server.service.free_text import check_free_text_fields

CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))] + list(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


@pytest.mark.parametrize("char", CONTROLS)
def test_every_control_character_is_found_and_written_out(char):
    text = f"a{char}b"
    assert first_control(text) == 1
    shown = visible(text)
    assert first_control(shown) is None and shown.startswith("a\\") and shown.endswith("b")
    assert first_control(text, allowed=char) is None
    assert visible(text, keep=char) == text


def test_visible_writes_out_what_a_terminal_would_obey():
    assert visible("\x1b]0;t\x07\x1b[2J") == "\\x1b]0;t\\x07\\x1b[2J"
    assert visible("\u202egpj.exe") == "\\u202egpj.exe"
    assert visible("line\n\ttab", keep="\n\t") == "line\n\ttab"
    assert visible("déjà vu — 東京") == "déjà vu — 東京"  # printable text is left alone


@given(st.text())
def test_visible_text_holds_no_control_character(text):
    shown = visible(text)
    assert first_control(shown) is None
    if first_control(text) is None:
        assert shown == text


SERVICES = [
    resource_manager_pb2.DESCRIPTOR.services_by_name["ResourceManagerService"],
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
    engine_conn_pb2.DESCRIPTOR.services_by_name["EngineConnService"],
    demand_pb2.DESCRIPTOR.services_by_name["DemandService"],
    usage_pb2.DESCRIPTOR.services_by_name["UsageService"],
]
USER_METHODS = [
    m for s in SERVICES for m in s.methods if not policy.serves_agents(f"{s.full_name}/{m.name}")
]


def _string_fields(
    descriptor: Descriptor, chain: tuple[FieldDescriptor, ...] = (), depth: int = 0
) -> Iterator[tuple[FieldDescriptor, ...]]:
    """The chain of fields down to every string (or map<string, string>) a request of
    `descriptor` can carry, but labels' and resources' (the domain checks those against
    patterns without control characters)."""
    for f in descriptor.fields:
        kind = f.message_type
        if kind is None:
            if f.type == FieldDescriptor.TYPE_STRING:
                yield (*chain, f)
        elif kind.GetOptions().map_entry:
            yield (*chain, f)
        elif kind.full_name not in ("labelrm.v1.Label", "labelrm.v1.Resource") and depth < 4:
            yield from _string_fields(kind, (*chain, f), depth + 1)


def _set(message: Any, chain: tuple[FieldDescriptor, ...], value: str) -> str:
    """Set the string at the end of `chain` to `value`; the field path it names."""
    path = ""
    for f in chain[:-1]:
        message = getattr(message, f.name).add() if f.is_repeated else getattr(message, f.name)
        path += f"{f.name}[0]." if f.is_repeated else f"{f.name}."
    leaf = chain[-1]
    if leaf.message_type is not None:  # a map: its value, under its key
        getattr(message, leaf.name)["k"] = value
        return f"{path}{leaf.name}.k"
    if leaf.is_repeated:
        getattr(message, leaf.name).append(value)
        return f"{path}{leaf.name}[0]"
    setattr(message, leaf.name, value)
    return path + leaf.name


@pytest.mark.parametrize("method", USER_METHODS, ids=lambda m: m.full_name)
def test_every_string_field_of_a_user_rpc_refuses_control_characters(method):
    request_type = message_factory.GetMessageClass(method.input_type)
    check_free_text_fields(request_type())  # an empty request passes
    chains = list(_string_fields(method.input_type))
    for chain in chains:
        request = request_type()
        named = _set(request, chain, "ok\x1b[2J")
        with pytest.raises(DomainError) as err:
            check_free_text_fields(request)
        assert err.value.field == named and "U+001B" in err.value.message
        plain = request_type()
        _set(plain, chain, "plain text, ünïcode")
        check_free_text_fields(plain)
