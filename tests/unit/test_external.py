"""Pure external-resource logic: YARN scheduler documents -> queue figures, providers, and
queue admission (rm_server/domain/external.py). Documents come from the stand-in YARN RM
(tests/yarn_standin.py), which follows Hadoop's ResourceManager REST documentation."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rm_server.domain.external import (
    MIB,
    MalformedResponse,
    ProviderConfig,
    ProviderConfigError,
    QueueCheck,
    SchedulerKind,
    UnknownQueue,
    UnsupportedScheduler,
    ha_state,
    parse_scheduler,
    queue_label,
    split_addresses,
)
from rm_server.domain.resources import Resource
from tests.support.messages import present
from tests.yarn_standin import Queue, YarnState, capacity_cluster, fair_cluster

GiB = 1024**3


def deep_capacity() -> YarnState:
    """root.a (50%, max 80%) > root.a.a1 (40% of a, max 50% of a) > root.a.a1.a1a / a1b."""
    root = Queue(
        "root",
        children=[
            Queue(
                "root.a",
                50.0,
                80.0,
                children=[
                    Queue(
                        "root.a.a1",
                        40.0,
                        50.0,
                        children=[
                            Queue("root.a.a1.a1a", 75.0, 100.0, max_apps=20),
                            Queue("root.a.a1.a1b", 25.0, 100.0),
                        ],
                    ),
                    Queue("root.a.a2", 60.0, 100.0),
                ],
            ),
            Queue("root.b", 50.0, 100.0),
        ],
    )
    return YarnState("capacity", root, 200 * 1024, 100)


def test_capacity_scheduler_queues_at_any_depth_in_bytes_and_millicores():
    state = deep_capacity()
    state.start_app("root.a.a1.a1a", 3 * 1024, 2)
    state.start_app("root.a.a1.a1a", 1024, 1, state="ACCEPTED")

    snap = parse_scheduler(state.scheduler_doc(), state.metrics_doc())

    assert snap.scheduler is SchedulerKind.CAPACITY
    assert set(snap.queues) == {
        "root.a",
        "root.a.a1",
        "root.a.a1.a1a",
        "root.a.a1.a1b",
        "root.a.a2",
        "root.b",
    }
    a1a = snap.queues["root.a.a1.a1a"]
    # absoluteMaxCapacity = 80% x 50% x 100% = 40% of 200 GiB, 100 vCores
    assert a1a.maximum == Resource.yarn("root.a.a1.a1a", 80 * GiB, 40_000, 20)
    assert a1a.used == Resource.yarn("root.a.a1.a1a", 3 * GiB, 2000, 2)
    assert (a1a.apps_running, a1a.apps_pending, a1a.leaf) == (1, 1, True)
    assert not snap.queues["root.a.a1"].leaf
    guaranteed = parse_scheduler(
        state.scheduler_doc(), state.metrics_doc(), capacity_guaranteed=True
    ).queues["root.a.a1.a1a"]
    # absoluteCapacity = 50% x 40% x 75% = 15% of 200 GiB
    assert guaranteed.maximum.get("yarn.memory_bytes") == 30 * GiB


def test_fair_scheduler_nested_queues_use_max_and_used_resources():
    state = fair_cluster()
    state.start_app("root.sample_queue.sample_sub_queue", 2048, 3)
    snap = parse_scheduler(state.scheduler_doc())
    sub = snap.queues["root.sample_queue.sample_sub_queue"]
    assert snap.scheduler is SchedulerKind.FAIR
    assert sub.maximum == Resource.yarn(sub.path, 16 * GiB, 16_000, 2**31 - 1)
    assert sub.used == Resource.yarn(sub.path, 2 * GiB, 3000, 1)
    assert (sub.apps_running, sub.apps_pending) == (1, 0)
    assert snap.queues["root.sample_queue"].maximum.get("yarn.instances") == 50


def test_queue_names_resolve_by_path_short_path_or_unique_leaf():
    snap = parse_scheduler(deep_capacity().scheduler_doc(), deep_capacity().metrics_doc())
    for name in ("root.a.a1.a1a", "a.a1.a1a", "a1a"):
        assert snap.resolve(name).path == "root.a.a1.a1a"
    with pytest.raises(UnknownQueue, match="no queue"):
        snap.resolve("a1c")
    with pytest.raises(UnknownQueue, match="invalid"):
        snap.resolve("a..b")
    twins = YarnState(
        "fair",
        Queue(
            "root",
            children=[
                Queue("root.x", children=[Queue("root.x.etl", max_mb=1, max_vcores=1)]),
                Queue("root.y", children=[Queue("root.y.etl", max_mb=1, max_vcores=1)]),
            ],
        ),
        10,
        1,
    )
    with pytest.raises(UnknownQueue, match=r"ambiguous: root\.x\.etl, root\.y\.etl"):
        parse_scheduler(twins.scheduler_doc()).resolve("etl")


def test_lone_children_and_bare_lists_are_read_too():
    """Jersey's JSON writer gives a lone child as an object, some releases a bare list."""
    doc = capacity_cluster().scheduler_doc()
    info = doc["scheduler"]["schedulerInfo"]
    a = info["queues"]["queue"][0]
    a["queues"]["queue"] = a["queues"]["queue"][0]  # {"queue": {...}}
    snap = parse_scheduler(doc, capacity_cluster().metrics_doc())
    assert "root.a.a1" in snap.queues and "root.a.a2" not in snap.queues
    fair = fair_cluster().scheduler_doc()
    root = fair["scheduler"]["schedulerInfo"]["rootQueue"]
    root["childQueues"] = root["childQueues"]["queue"]  # a bare list
    assert "root.sample_queue.sample_sub_queue" in parse_scheduler(fair).queues


def test_unsupported_and_malformed_documents_are_named_errors():
    fifo = YarnState("fifo", Queue("root"), 1, 1)
    with pytest.raises(UnsupportedScheduler, match="fifoScheduler"):
        parse_scheduler(fifo.scheduler_doc())
    cap = capacity_cluster()
    with pytest.raises(MalformedResponse, match="metrics"):
        parse_scheduler(cap.scheduler_doc(), None)
    broken = cap.scheduler_doc()
    broken["scheduler"]["schedulerInfo"]["queues"]["queue"][1]["resourcesUsed"]["memory"] = "12"
    with pytest.raises(MalformedResponse, match=r"queue root.b.resourcesUsed.memory"):
        parse_scheduler(broken, cap.metrics_doc())
    negative = cap.scheduler_doc()
    negative["scheduler"]["schedulerInfo"]["queues"]["queue"][1]["absoluteMaxCapacity"] = -1
    with pytest.raises(MalformedResponse, match="negative"):
        parse_scheduler(negative, cap.metrics_doc())
    junks: tuple[Any, ...] = (None, [], {"scheduler": 3}, {"scheduler": {"schedulerInfo": []}})
    for junk in junks:
        with pytest.raises((MalformedResponse, UnsupportedScheduler)):
            parse_scheduler(junk)
    nameless = fair_cluster().scheduler_doc()
    del nameless["scheduler"]["schedulerInfo"]["rootQueue"]["childQueues"]["queue"][0]["queueName"]
    with pytest.raises(MalformedResponse, match="queueName"):
        parse_scheduler(nameless)


def test_ha_state_of_the_cluster_info_document():
    state = capacity_cluster()
    assert ha_state(state.info_doc("STANDBY")) == "STANDBY"
    no_ha = state.info_doc("ACTIVE")
    del no_ha["clusterInfo"]["haState"]
    assert ha_state(no_ha) == ""
    with pytest.raises(MalformedResponse):
        ha_state({"clusterInfo": {"haState": 3}})


def provider(**kw) -> ProviderConfig:
    base = {
        "name": "prod-yarn",
        "type": "yarn",
        "cluster": "prod",
        "addresses": ("http://rm1:8088", "http://rm2:8088"),
    }
    return ProviderConfig(**{**base, **kw})


def test_provider_validation_names_the_field_and_redacts_the_secret():
    p = provider(auth="basic", username="yarn", password="pw")
    assert p.redacted().password == "" and p.redacted().username == "yarn"
    again = ProviderConfig.from_stored(p.name, p.type.value, p.cluster, p.to_config_json())
    assert again == p
    assert split_addresses(" http://a:1/ ;http://b:2;") == ("http://a:1", "http://b:2")
    bad: list[tuple[dict[str, Any], str]] = [
        ({"name": "Prod"}, "name"),
        ({"type": "k8s"}, "type"),
        ({"cluster": "a b"}, "cluster"),
        ({"addresses": ()}, "addresses"),
        ({"addresses": ("rm1:8088",)}, "addresses[0]"),
        ({"addresses": ("http://a:1", "http://a:1")}, "addresses"),
        ({"auth": "kerberos"}, "auth"),
        ({"auth": "basic"}, "username"),
        ({"password": "x"}, "auth"),
        ({"timeout_seconds": 0.0}, "timeout_seconds"),
        ({"cache_ttl_seconds": float("nan")}, "cache_ttl_seconds"),
    ]
    for change, field in bad:
        with pytest.raises(ProviderConfigError) as err:
            provider(**change)
        assert err.value.field == field, change


def test_queue_check_breaks_the_shortfall_down():
    snap = parse_scheduler(capacity_cluster().scheduler_doc(), capacity_cluster().metrics_doc())
    label = queue_label("prod", "root.b")
    check = QueueCheck(label, snap.queues["root.b"])
    in_flight = Resource.yarn("root.b", 90 * GiB, 0, 0)
    request = Resource.yarn("root.b", 20 * GiB, 1000, 1)
    refusal = check.refusal(in_flight, request)
    assert refusal is not None
    assert [(s.label, s.dimension, s.requested, s.available) for s in refusal.shortfalls] == [
        (label, "yarn.memory_bytes", 20 * GiB, 10 * GiB)
    ]
    assert f"YARN max {100 * GiB} - YARN used 0 - labelrm in flight {90 * GiB}" in refusal.detail
    assert check.refusal(in_flight, Resource.yarn("root.b", 10 * GiB, 1000, 1)) is None
    assert check.refusal(in_flight, Resource.load(GiB, 1)) is None  # nothing for YARN


_GIB_MB = st.integers(min_value=0, max_value=4096)


@settings(max_examples=200, deadline=None)
@given(
    max_mb=_GIB_MB,
    used_mb=_GIB_MB,
    flight_mb=_GIB_MB,
    want_mb=_GIB_MB,
    max_vc=st.integers(0, 64),
    used_vc=st.integers(0, 64),
    want_vc=st.integers(0, 64),
)
def test_admitted_exactly_when_the_request_fits_what_yarn_and_labelrm_leave(
    max_mb, used_mb, flight_mb, want_mb, max_vc, used_vc, want_vc
):
    """Invariant: admitted iff, in every dimension, request <= max - used - in flight
    (and what is left is never negative, whatever YARN reports)."""
    state = YarnState(
        "fair",
        Queue("root", children=[Queue("root.q", max_mb=max_mb, max_vcores=max_vc)]),
        8192,
        128,
    )
    if used_mb or used_vc:
        state.start_app("root.q", used_mb, used_vc)
    figures = parse_scheduler(state.scheduler_doc()).queues["root.q"]
    in_flight = Resource.yarn("root.q", flight_mb * MIB, 0, 0)
    request = Resource.yarn("root.q", want_mb * MIB, want_vc * 1000, 1)
    refusal = QueueCheck("q", figures).refusal(in_flight, request)
    fits = want_mb <= max(0, max_mb - used_mb - flight_mb) and want_vc <= max(0, max_vc - used_vc)
    assert (refusal is None) == fits
    if refusal is not None:
        assert all(s.available >= 0 and s.requested > s.available for s in refusal.shortfalls)


@st.composite
def capacity_trees(draw, depth: int = 0, path: str = "root"):
    n = draw(st.integers(0 if depth else 1, 3 if depth < 3 else 0))
    children = [draw(capacity_trees(depth + 1, f"{path}.q{depth}x{i}")) for i in range(n)]
    return Queue(
        path,
        draw(st.floats(0, 100, allow_nan=False)),
        draw(st.floats(0, 100, allow_nan=False)),
        children=children,
    )


@settings(max_examples=100, deadline=None)
@given(tree=capacity_trees(), total_gib=st.integers(1, 1024))
def test_every_capacity_queue_is_found_at_its_path_and_never_exceeds_the_cluster(tree, total_gib):
    state = YarnState("capacity", tree, total_gib * 1024, total_gib)
    doc = state.scheduler_doc()
    snap = parse_scheduler(copy.deepcopy(doc), state.metrics_doc())
    expected, stack = set(), list(tree.children)
    while stack:
        q = stack.pop()
        expected.add(q.path)
        stack.extend(q.children)
    assert set(snap.queues) == expected
    for path, figures in snap.queues.items():
        assert snap.resolve(path) is figures
        assert figures.leaf == (not present(state._find(path)).children)
        assert 0 <= figures.maximum.get("yarn.memory_bytes") <= total_gib * GiB
        assert 0 <= figures.maximum.get("yarn.cpu_millis") <= total_gib * 1000
