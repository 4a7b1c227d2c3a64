"""Tests for rm_server.domain.labels: validation, parsing and the label transform."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rm_server.domain.labels import (
    DEFAULT_RULES,
    MAX_LABEL_LENGTH,
    MAX_LABELS,
    Label,
    LabelError,
    LabelKey,
    TransformRule,
    make_label,
    parse_rules,
    transform,
    validate_labels,
)


def L(text: str) -> Label:
    return Label.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "userCreator=alice-IDE",
        "userCreator=bob_1.x-y-nodeexecution",  # user may contain '-': split at the LAST '-'
        "userCreator=_svc-Scheduler_2",
        "engineType=spark-3.2.1",
        "engineType=hive-2.3.3",
        "engineType=python-python3",  # split at the FIRST '-'
        "emInstance=host-1.example.com:9101",
        "emInstance=ecm1",
        "ecInstance=10.0.0.7:65535",
        "tenant=teamA",
        "route=a/b+c@d:e",
    ],
)
def test_valid_labels(text: str) -> None:
    label = L(text)
    assert str(label) == text
    assert Label.parse(str(label)) == label


@pytest.mark.parametrize(
    "text",
    [
        "userCreator=root;rm",
        "userCreator=../x",
        "userCreator=a b-IDE",
        "userCreator=alice",  # no creator
        "userCreator=Alice-IDE",  # user must be lower case
        "userCreator=alice-",  # empty creator
        "userCreator=-IDE",  # empty user
        "userCreator=alice-ID/E",
        "userCreator=" + "a" * 33 + "-IDE",  # user too long
        "engineType=spark",  # no version
        "engineType=Spark-3.2",  # type must be lower case
        "engineType=spark-",
        "engineType=spark-3.2-rc1",  # version may not contain '-'
        "engineType=1spark-3",
        "emInstance=host:0",
        "emInstance=host:65536",
        "emInstance=host:123456",
        "emInstance=host:",
        "ecInstance=a/b",
        "emInstance=:9101",
        "tenant=",
        "tenant=a b",
        "tenant=a*",
        "tenant=a,b",
        "tenant=a=b",
        "tenant=a\n",
        "1tenant=x",
        "=x",
        "ten ant=x",
        "k" * 65 + "=x",
        "novalue",
    ],
)
def test_invalid_labels(text: str) -> None:
    with pytest.raises(LabelError):
        L(text)


def test_label_length_limit() -> None:
    key = "k"
    ok = "v" * (MAX_LABEL_LENGTH - len(key) - 1)
    assert len(str(Label(key, ok))) == MAX_LABEL_LENGTH
    with pytest.raises(LabelError):
        Label(key, ok + "v")


def test_label_properties() -> None:
    uc = L("userCreator=bob-x-IDE")
    assert (uc.user, uc.creator) == ("bob-x", "IDE")
    et = L("engineType=python-python3")
    assert (et.engine, et.version) == ("python", "python3")
    with pytest.raises(LabelError):
        _ = et.user


def test_make_label_field_path() -> None:
    with pytest.raises(LabelError) as exc:
        make_label("engineType", "spark", "labels[3]")
    assert exc.value.field == "labels[3].value"
    with pytest.raises(LabelError) as exc2:
        make_label("bad key", "x", "labels[0]")
    assert exc2.value.field == "labels[0].key"
    with pytest.raises(LabelError) as exc3:
        make_label("k", 5, "labels[1]")
    assert exc3.value.field == "labels[1].value"


def test_validate_labels() -> None:
    labels = [L("userCreator=alice-IDE"), L("engineType=spark-3.2.1")]
    assert validate_labels(labels) == {"userCreator": labels[0], "engineType": labels[1]}
    with pytest.raises(LabelError) as exc:
        validate_labels([L("a=1"), L("b=2"), L("a=3")])
    assert exc.value.field == "labels[2].key"
    too_many = [Label(f"k{i}", "v") for i in range(MAX_LABELS + 1)]
    with pytest.raises(LabelError) as exc2:
        validate_labels(too_many)
    assert exc2.value.field == "labels"
    assert len(validate_labels(too_many[:MAX_LABELS])) == MAX_LABELS


def test_transform_combined_and_single() -> None:
    keys = transform(
        [L("userCreator=alice-IDE"), L("engineType=spark-3.2.1"), L("emInstance=ecm1:9101")]
    )
    assert [str(k) for k in keys] == [
        "emInstance=ecm1:9101",
        "userCreator=alice-IDE,engineType=spark-3.2.1",
    ]


def test_transform_missing_engine_type() -> None:
    keys = transform([L("userCreator=alice-IDE"), L("emInstance=ecm1")])
    assert [str(k) for k in keys] == ["emInstance=ecm1"]
    assert transform([L("tenant=x")]) == ()


def test_transform_accepts_mapping_and_custom_rules() -> None:
    labels = {"tenant": L("tenant=t1"), "userCreator": L("userCreator=bob-IDE")}
    rules = parse_rules("userCreator+tenant; tenant ;")
    assert rules == (TransformRule(("userCreator", "tenant")), TransformRule(("tenant",)))
    keys = transform(labels, rules)
    # sorted by str(key), while each key keeps its rule's label order
    assert [str(k) for k in keys] == ["tenant=t1", "userCreator=bob-IDE,tenant=t1"]
    with pytest.raises(LabelError):
        transform({"tenant": L("other=x")})


def test_transform_rejects_duplicate_keys() -> None:
    with pytest.raises(LabelError):
        transform([L("emInstance=a"), L("emInstance=b")])


def test_parse_rules_errors() -> None:
    assert parse_rules("userCreator+engineType;emInstance") == DEFAULT_RULES
    for bad in ["a++b", "a;a", "a+a", "1x", "a b"]:
        with pytest.raises(LabelError):
            parse_rules(bad)


def test_label_key_parse_round_trip_and_errors() -> None:
    text = "userCreator=alice-IDE,engineType=spark-3.2.1"
    key = LabelKey.parse(text)
    assert str(key) == text
    assert key.keys() == ("userCreator", "engineType")
    for bad in ["", "a=1,a=2", "a=1,", "userCreator=alice", "a=1,,b=2"]:
        with pytest.raises(LabelError):
            LabelKey.parse(bad)


VALUE_CHARS = st.sampled_from(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:@/+-"
)
generic_labels = st.builds(
    Label,
    st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,20}", fullmatch=True).filter(
        lambda k: k not in {"userCreator", "engineType", "emInstance", "ecInstance"}
    ),
    st.text(VALUE_CHARS, min_size=1, max_size=40),
)


@given(st.lists(generic_labels, min_size=1, max_size=5, unique_by=lambda lb: lb.key))
def test_label_key_round_trip(labels: list[Label]) -> None:
    key = LabelKey(tuple(labels))
    assert LabelKey.parse(str(key)) == key


@given(st.lists(generic_labels, max_size=6, unique_by=lambda lb: lb.key))
def test_transform_output_sorted_and_unique(labels: list[Label]) -> None:
    keys = [lb.key for lb in labels]
    combined = ["+".join(keys[:2])] if len(keys) >= 2 else []
    rules = parse_rules(";".join(keys + combined))
    out = transform(labels, rules)
    strs = [str(k) for k in out]
    assert strs == sorted(strs)
    assert len(set(strs)) == len(strs)
    assert len(out) == len(rules)


def test_errors_quote_offending_values_cut_short():
    from rm_server.domain.labels import LabelError, check_key

    with pytest.raises(LabelError) as err:
        check_key("k" * 1_000_000)
    assert len(str(err.value)) < 300 and "1000000 characters" in str(err.value)
