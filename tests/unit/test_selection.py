"""ECM selection rules and ranking (rm_server.domain.selection)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.labels import Label
from rm_server.domain.resources import Resource, ResourceKind
from rm_server.domain.selection import (
    DEFAULT_RULES,
    EcmCandidate,
    HealthRule,
    LabelMatchRule,
    LoadRule,
    ResourceRule,
    SelectionRequest,
    StandbyRule,
    Verdict,
    ecm_shortfalls,
    rank,
)

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
GI = 2**30


def L(text: str) -> Label:
    return Label.parse(text)


def ecm(instance: str = "h1:9000", **kw: object) -> EcmCandidate:
    base = EcmCandidate(
        instance=instance,
        labels=(L("cluster=c1"),),
        state="RUNNING",
        allowed=True,
        last_heartbeat=NOW - timedelta(seconds=2.1),
        registered_at=NOW - timedelta(hours=1),
        total=Resource.load_instance(8 * GI, 8000, 100),
        left=Resource.load_instance(4 * GI, 4000, 50),
        live_engine_conns=3,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def req(*labels: str, resource: Resource | None = None) -> SelectionRequest:
    return SelectionRequest(
        labels=tuple(L(t) for t in labels or ("userCreator=alice-IDE", "engineType=shell-1")),
        resource=resource or Resource.load_instance(GI, 1000, 1),
        now=NOW,
    )


# ----- LabelMatchRule ------------------------------------------------------------------------


def test_label_match_ignores_engine_and_owner_labels():
    v = LabelMatchRule().evaluate(ecm(), req("userCreator=alice-IDE", "engineType=shell-1"))
    assert v == Verdict(True, 1.0, "labels: no placement labels requested")


def test_label_match_requires_same_value():
    r = req("engineType=shell-1", "cluster=c1")
    assert LabelMatchRule().evaluate(ecm(), r) == Verdict(True, 1.0, "labels: cluster=c1 matches")
    v = LabelMatchRule().evaluate(ecm(labels=(L("cluster=c2"),)), r)
    assert not v.eligible and "cluster=c1" in v.reason and "cluster=c2" in v.reason
    assert not LabelMatchRule().evaluate(ecm(labels=()), r).eligible


def test_em_instance_pins_one_ecm():
    r = req("engineType=shell-1", "emInstance=h2:9000")
    assert not LabelMatchRule().evaluate(ecm("h1:9000"), r).eligible
    assert LabelMatchRule().evaluate(ecm("h2:9000"), r).eligible
    choices = rank([ecm("h1:9000"), ecm("h2:9000"), ecm("h3:9000")], r)
    assert [(c.instance, c.eligible) for c in choices] == [
        ("h2:9000", True),
        ("h1:9000", False),
        ("h3:9000", False),
    ]


# ----- HealthRule ----------------------------------------------------------------------------


def test_health_accepts_fresh_heartbeat():
    assert HealthRule().evaluate(ecm(), req()) == Verdict(True, 1.0, "health: heartbeat 2.1s ago")


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"state": "DRAINING"}, "DRAINING"),
        ({"state": "LOST"}, "LOST"),
        ({"allowed": False}, "excluded"),
        ({"last_heartbeat": NOW - timedelta(seconds=31)}, "stale"),
        ({"last_heartbeat": None, "registered_at": NOW - timedelta(seconds=45)}, "no heartbeat"),
    ],
)
def test_unhealthy_ecm_is_never_chosen(kw, fragment):
    bad = ecm("a-bad", **kw)
    v = HealthRule().evaluate(bad, req())
    assert not v.eligible and fragment in v.reason
    choices = rank([bad, ecm("z-good")], req())
    assert choices[0].instance == "z-good" and choices[0].eligible
    assert choices[1] == replace(choices[1], instance="a-bad", eligible=False, score=0.0)


def test_never_heartbeated_ecm_within_expiry_is_ok():
    c = ecm(last_heartbeat=None, registered_at=NOW - timedelta(seconds=5))
    assert HealthRule().evaluate(c, req()).eligible


# ----- ResourceRule --------------------------------------------------------------------------


def test_resource_shortfall_is_ineligible_with_reason():
    r = req(resource=Resource.load_instance(2 * GI, 1000, 1))
    v = ResourceRule().evaluate(ecm(left=Resource.load_instance(GI, 4000, 50)), r)
    assert v == Verdict(False, 0.0, "resource: memory_bytes requested 2Gi, available 1Gi")


def test_resource_score_is_mean_free_fraction_after_placing():
    # total 8Gi / 8000m; left 4Gi / 4000m; request 1Gi / 1000m -> 3/8 free in both.
    v = ResourceRule().evaluate(ecm(), req())
    assert v.eligible and v.score == pytest.approx(3 / 8)
    assert v.reason == "resource: fits, free after: memory_bytes 3Gi, cpu_millis 3000m"


def test_resource_honours_named_dimensions():
    # A load ECM says nothing about instances, so a load_instance request is checked on
    # memory and CPU only (admission.py's rule), even though the headroom has 0 instances.
    c = ecm(total=Resource.load(8 * GI, 8000), left=Resource.load_instance(4 * GI, 4000, 0))
    assert ResourceRule().evaluate(c, req()).eligible


def test_resource_incompatible_kind_is_ineligible():
    c = ecm(total=Resource.special({"gpu": 2}), left=Resource.special({"gpu": 2}))
    v = ResourceRule().evaluate(c, req())
    assert not v.eligible and "incompatible" in v.reason


# ----- LoadRule and StandbyRule --------------------------------------------------------------


def test_load_score():
    assert LoadRule().evaluate(ecm(), req()) == Verdict(True, 0.25, "load: 3 live EngineConns")
    assert LoadRule().evaluate(ecm(live_engine_conns=0), req()).score == 1.0


def test_standby_is_eligible_but_scores_zero():
    c = ecm(registered_at=NOW - timedelta(seconds=12))
    assert StandbyRule().evaluate(c, req()) == Verdict(
        True, 0.0, "standby: registered 12s ago (standby)"
    )
    assert StandbyRule().evaluate(ecm(), req()).score == 1.0


def test_standby_used_only_when_nothing_else_fits():
    # The standby is idle and empty; the established ECM is busy and nearly full. Still the
    # established one wins while it fits.
    standby = ecm(
        "a-standby",
        registered_at=NOW - timedelta(seconds=5),
        last_heartbeat=None,
        left=Resource.load_instance(8 * GI, 8000, 100),
        live_engine_conns=0,
    )
    busy = ecm("b-busy", left=Resource.load_instance(GI, 1000, 1), live_engine_conns=50)
    assert [c.instance for c in rank([standby, busy], req())] == ["b-busy", "a-standby"]
    full = replace(busy, left=Resource.load_instance(0, 0, 0))
    choices = rank([standby, full], req())
    assert [(c.instance, c.eligible) for c in choices] == [("a-standby", True), ("b-busy", False)]


# ----- rank() --------------------------------------------------------------------------------


def test_rank_orders_by_score_then_instance_and_lists_reasons():
    roomy = ecm("c", left=Resource.load_instance(7 * GI, 7000, 90), live_engine_conns=0)
    tie_a, tie_b = ecm("b"), ecm("a")
    gone = ecm("0-lost", state="LOST")
    choices = rank([tie_a, gone, roomy, tie_b], req())
    assert [c.instance for c in choices] == ["c", "a", "b", "0-lost"]
    assert choices[1].score == choices[2].score and choices[0].score > choices[1].score
    assert [r.split(":")[0] for r in choices[0].reasons] == [
        "labels",
        "health",
        "resource",
        "load",
        "standby",
    ]
    assert choices[-1].score == 0.0 and "health: state LOST" in choices[-1].reasons


def test_rank_accepts_custom_rules():
    @dataclass(frozen=True)
    class Prefer:
        name: str = "prefer"
        weight: float = 1.0

        def evaluate(self, c: EcmCandidate, r: SelectionRequest) -> Verdict:
            return Verdict(True, 1.0 if c.instance == "z" else 0.0, f"prefer: {c.instance}")

    choices = rank([ecm("a"), ecm("z")], req(), rules=[Prefer()])
    assert [(c.instance, c.score, c.reasons) for c in choices] == [
        ("z", 1.0, ("prefer: z",)),
        ("a", 0.0, ("prefer: a",)),
    ]


def test_rank_rejects_duplicates_and_bad_weights():
    with pytest.raises(ValueError, match="duplicate"):
        rank([ecm("a"), ecm("a")], req())
    with pytest.raises(ValueError, match="weight"):
        rank([ecm("a")], req(), rules=[LoadRule(weight=-1.0)])


def test_verdict_score_must_be_in_unit_interval():
    with pytest.raises(ValueError):
        Verdict(True, 1.5, "x")
    with pytest.raises(ValueError):
        Verdict(True, float("nan"), "x")


# ----- properties ----------------------------------------------------------------------------

q = st.integers(min_value=0, max_value=16)


@st.composite
def candidates(draw: st.DrawFn) -> list[EcmCandidate]:
    names = draw(st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8))
    out = []
    for name in names:
        total = Resource.load_instance(draw(q), draw(q), draw(q))
        left = Resource.load_instance(draw(q), draw(q), draw(q))
        out.append(
            EcmCandidate(
                instance=name,
                labels=draw(st.sampled_from([(), (L("cluster=c1"),), (L("cluster=c2"),)])),
                state=draw(st.sampled_from(["RUNNING", "RUNNING", "DRAINING", "LOST"])),
                allowed=draw(st.booleans()),
                last_heartbeat=draw(
                    st.none() | st.builds(lambda s: NOW - timedelta(seconds=s), st.integers(0, 60))
                ),
                registered_at=NOW - timedelta(seconds=draw(st.integers(0, 120))),
                total=total,
                left=left,
                live_engine_conns=draw(st.integers(0, 5)),
            )
        )
    return out


requests = st.builds(
    lambda cluster, m, c, i: SelectionRequest(
        labels=(L("engineType=shell-1"), *((L(cluster),) if cluster else ())),
        resource=Resource.load_instance(m, c, i),
        now=NOW,
    ),
    st.sampled_from(["", "cluster=c1"]),
    q,
    q,
    q,
)


@given(candidates(), requests, st.randoms(use_true_random=False))
def test_rank_properties(cands, request, rnd):
    choices = rank(cands, request)
    assert sorted(c.instance for c in choices) == sorted(c.instance for c in cands)
    by_name = {c.instance: c for c in cands}
    for ch in choices:
        assert 0.0 <= ch.score <= 1.0 and len(ch.reasons) == len(DEFAULT_RULES)
        if ch.eligible:
            c = by_name[ch.instance]
            assert ecm_shortfalls(c, request.resource) == []
            assert c.state == "RUNNING" and c.allowed
        else:
            assert ch.score == 0.0
    flags = [ch.eligible for ch in choices]
    assert flags == sorted(flags, reverse=True)
    shuffled = list(cands)
    rnd.shuffle(shuffled)
    assert rank(shuffled, request) == choices


def test_shortfalls_ignore_unnamed_dimensions():
    c = ecm(total=Resource.load(1, 1), left=Resource.zero(ResourceKind.LOAD_INSTANCE))
    assert [s.dimension for s in ecm_shortfalls(c, Resource.load_instance(1, 0, 5))] == [
        "memory_bytes"
    ]


def test_node_lists_deny_by_default_when_the_include_list_is_required():
    from rm_server.domain.engineconn import node_allowed

    none: frozenset[str] = frozenset()
    assert node_allowed("agent1", none, none)  # YARN's default: no include list, all in
    assert not node_allowed("agent1", none, none, include_required=True)
    listed = frozenset({"agent1", "host2"})
    for required in (False, True):
        assert node_allowed("agent1", listed, none, required)
        assert node_allowed("host2:9000", listed, none, required)  # a host names its ECMs
        assert not node_allowed("agent3", listed, none, required)
        assert not node_allowed("agent1", listed, frozenset({"agent1"}), required)
