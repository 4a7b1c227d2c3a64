"""The demand state machine: the table is the whole truth."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.demands.state import (
    TRANSITIONS,
    DemandState,
    InvalidTransition,
    step,
    transition,
)

S = DemandState
CHAIN = [S.NEW, S.ACCEPTED, S.ALLOCATING, S.ALLOCATED, S.MONITORING, S.FINISHED]
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_happy_path_is_the_papers_chain():
    state = S.NEW
    for target in CHAIN[1:]:
        state = transition(state, target)
    assert state is S.FINISHED


@pytest.mark.parametrize("state", [s for s in S if s is not S.FINISHED and s is not S.FAILED])
def test_every_non_terminal_state_may_fail(state):
    assert transition(state, S.FAILED) is S.FAILED


@pytest.mark.parametrize("state", [S.FINISHED, S.FAILED])
def test_terminal_states_go_nowhere(state):
    assert state.terminal
    for target in S:
        with pytest.raises(InvalidTransition):
            transition(state, target)


def test_no_skipping_and_no_going_back():
    with pytest.raises(InvalidTransition, match="a ACCEPTED demand cannot become ALLOCATED"):
        transition(S.ACCEPTED, S.ALLOCATED)
    with pytest.raises(InvalidTransition):
        transition(S.ALLOCATED, S.ALLOCATING)
    with pytest.raises(InvalidTransition):
        transition(S.FINISHED, S.FAILED)  # FAILED from any state *but* FINISHED


def test_the_table_is_exactly_the_chain_plus_failure():
    expected = set(itertools.pairwise(CHAIN))
    expected |= {(s, S.FAILED) for s in CHAIN[:-1]}
    actual = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert actual == expected


@given(st.lists(st.sampled_from(list(S)), max_size=20))
def test_any_walk_only_takes_allowed_steps(targets):
    state = S.NEW
    history = []
    for target in targets:
        try:
            record = step(state, target, NOW, "test")
        except InvalidTransition:
            assert target not in TRANSITIONS[state]
            continue
        assert record.from_state is state and record.to_state is target
        history.append(record)
        state = target
    # The history is a path through the table, ending in at most one terminal state.
    assert all(r.to_state in TRANSITIONS[r.from_state] for r in history if r.from_state)
    assert sum(r.to_state.terminal for r in history) <= 1
