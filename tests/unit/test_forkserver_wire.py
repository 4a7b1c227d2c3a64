"""The fork server's line protocol (labelrm_common/forkserver_wire.py), both ends' one
definition: what is encoded decodes to itself, and nothing else is a message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labelrm_common import forkserver_wire as wire

texts = st.text(max_size=20)
pids = st.integers(min_value=0, max_value=2**22)

requests = st.one_of(
    st.builds(
        wire.Spawn,
        texts,
        texts,
        st.lists(texts, max_size=4).map(tuple),
        st.dictionaries(texts, texts, max_size=3),
        st.booleans(),
    ),
    st.builds(wire.Go, pids),
)
replies = st.one_of(
    st.builds(wire.Ready, pids, st.booleans()),
    st.builds(wire.Spawned, texts, pids),
    st.builds(wire.Failed, texts, texts),
    st.builds(wire.Exit, pids, st.integers(0, 65535), st.floats(0, 1e9)),
)


@given(requests)
def test_a_request_decodes_to_itself(message):
    line = wire.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.decode_request(line) == message


@given(replies)
def test_a_reply_decodes_to_itself(message):
    assert wire.decode_reply(wire.encode(message)) == message


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b'["exit", 1]',
        b'{"exit": "1234", "status": 0}',
        b'{"exit": true, "status": 0}',
        b'{"spawned": "ec-1"}',
        b'{"whatever": 1}',
    ],
)
def test_what_the_agent_refuses(line):
    with pytest.raises(wire.WireError):
        wire.decode_reply(line)


@pytest.mark.parametrize(
    "line",
    [
        b'{"go": "12"}',
        b'{"spawn": "ec-1", "cwd": "/w", "argv": "python", "env": {}}',
        b'{"spawn": "ec-1", "cwd": "/w", "argv": [], "env": {"A": 1}}',
        b'{"spawn": 1, "cwd": "/w", "argv": [], "env": {}}',
        b'{"spawn": "ec-1", "argv": [], "env": {}}',
    ],
)
def test_what_the_server_refuses(line):
    with pytest.raises(wire.WireError):
        wire.decode_request(line)
