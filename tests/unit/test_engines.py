"""Engine plugins: the resource factory, the launch builder and the registry."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rm_server.domain.labels import Label
from rm_server.domain.resources import Resource
from rm_server.engines import (
    PLUGINS,
    InvalidParam,
    LaunchContext,
    effective_params,
    plugin_for,
    resolve_params,
)


def ctx(engine: str = "shell", **params: str) -> LaunchContext:
    return LaunchContext(
        ec_id="ec-42",
        user="alice",
        engine=engine,
        version="1",
        labels=(Label.parse("userCreator=alice-IDE"), Label.parse(f"engineType={engine}-1")),
        params=params,
    )


def test_registry():
    assert sorted(PLUGINS) == ["python", "shell", "spark"]
    assert plugin_for("shell").name == "shell"
    assert plugin_for("python").name == "python"
    with pytest.raises(InvalidParam) as exc:
        plugin_for("flink")
    assert exc.value.field == "labels"
    assert exc.value.message == "unknown engine type 'flink'; known: python, shell, spark"


@pytest.mark.parametrize("engine", ["shell", "python"])
def test_default_resource(engine):
    assert plugin_for(engine).resource({}, {}) == Resource.load_instance(268435456, 500, 1)


def test_overrides_explicit_over_defaults_over_builtin():
    plugin = plugin_for("shell")
    defaults = {"memory_bytes": "1073741824", "cpu_millis": "2000"}
    assert plugin.resource({}, defaults) == Resource.load_instance(2**30, 2000, 1)
    assert plugin.resource({"cpu_millis": "250"}, defaults) == Resource.load_instance(2**30, 250, 1)
    assert resolve_params({"max_idle_seconds": "5"}, {"max_idle_seconds": "9"}) == {
        "memory_bytes": 268435456,
        "cpu_millis": 500,
        "max_idle_seconds": 5,
    }
    assert effective_params({}, defaults)["memory_bytes"] == "1073741824"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"memory_bytes": "0"}, "params.memory_bytes"),
        ({"memory_bytes": "-1"}, "params.memory_bytes"),
        ({"memory_bytes": "1e9"}, "params.memory_bytes"),
        ({"memory_bytes": " 12"}, "params.memory_bytes"),
        ({"memory_bytes": "1_000"}, "params.memory_bytes"),
        ({"memory_bytes": "\u0661\u0662"}, "params.memory_bytes"),  # Arabic-Indic digits
        ({"memory_bytes": str(2**41)}, "params.memory_bytes"),
        ({"memory_bytes": "9" * 400}, "params.memory_bytes"),
        ({"cpu_millis": ""}, "params.cpu_millis"),
        ({"cpu_millis": "0"}, "params.cpu_millis"),
        ({"cpu_millis": str(10**9)}, "params.cpu_millis"),
        ({"max_idle_seconds": "0"}, "params.max_idle_seconds"),
        ({"max_idle_seconds": str(10**8)}, "params.max_idle_seconds"),
        ({"gpus": "1"}, "params.gpus"),
        ({"a\nb": "1"}, "params.'a\\nb'"),
    ],
)
def test_bad_params_are_refused(params, field):
    for engine in ("shell", "python"):
        with pytest.raises(InvalidParam) as exc:
            plugin_for(engine).resource(params, {})
        assert exc.value.field == field
    with pytest.raises(InvalidParam) as exc:
        plugin_for("shell").launch(ctx(**params))
    assert exc.value.field == field


@pytest.mark.parametrize(
    ("params", "memory", "cpu"),
    [
        ({"memory_bytes": "512Mi"}, 512 << 20, 500),
        ({"memory_bytes": "1.5Gi", "cpu_millis": "250m"}, 3 << 29, 250),
        ({"memory_bytes": "1G", "cpu_millis": "2000"}, 10**9, 2000),
    ],
)
def test_amounts_take_the_quantities_people_write(params, memory, cpu):
    """`--param memory_bytes=512Mi` was refused as "not a non-negative decimal integer":
    one quantity syntax wherever a user types an amount (as rmctl's --memory / --cpu)."""
    resource = plugin_for("shell").resource(params, {})
    assert (resource.get("memory_bytes"), resource.get("cpu_millis")) == (memory, cpu)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"memory_bytes": "lots"}, "'lots' is not an amount of memory: 512Mi, 2Gi, 1G or bytes"),
        ({"memory_bytes": "1.5"}, "'1.5' is not an amount of memory"),  # half a byte
        ({"cpu_millis": "0.5"}, "'0.5' is not an amount of CPU in millicores: 500 or 500m"),
        ({"max_idle_seconds": "10m"}, "'10m' is not a non-negative decimal integer"),
    ],
)
def test_a_wrong_amount_says_what_is_expected(params, message):
    with pytest.raises(InvalidParam, match=message):
        plugin_for("shell").resource(params, {})


def test_bad_defaults_are_refused():
    with pytest.raises(InvalidParam) as exc:
        plugin_for("shell").resource({}, {"memory_byte": "1"})
    assert exc.value.field == "defaults.memory_byte"
    with pytest.raises(InvalidParam) as exc:
        plugin_for("shell").resource({}, {"cpu_millis": "lots"})
    assert exc.value.field == "defaults.cpu_millis"
    # An explicit param does not excuse a broken default for the same name.
    with pytest.raises(InvalidParam):
        plugin_for("shell").resource({"cpu_millis": "1"}, {"cpu_millis": "x", "nope": "1"})


@pytest.mark.parametrize("engine", ["shell", "python"])
def test_launch_request(engine):
    lr = plugin_for(engine).launch(ctx(engine, max_idle_seconds="30"))
    assert lr.program == "python"
    assert lr.argv == (
        "-m",
        "engineconn",
        "--ec-id",
        "ec-42",
        "--engine",
        engine,
        "--max-idle-seconds",
        "30",
        "--label",
        "userCreator=alice-IDE",
        "--label",
        f"engineType={engine}-1",
    )
    assert dict(lr.environment) == {"LABELRM_ENGINE_VERSION": "1"}
    assert lr.required_local_environment == ("LABELRM_RM",)
    assert lr.material_files == ()


def test_launch_default_idle_time():
    argv = plugin_for("shell").launch(ctx()).argv
    assert argv[argv.index("--max-idle-seconds") + 1] == "600"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"ec_id": "../x"}, "ec_id"),
        ({"ec_id": "a\nb"}, "ec_id"),
        ({"ec_id": ""}, "ec_id"),
        ({"version": "$(id)"}, "labels"),
        ({"engine": "python"}, "labels"),
    ],
)
def test_launch_refuses_bad_context(change, field):
    with pytest.raises(InvalidParam) as exc:
        plugin_for("shell").launch(replace(ctx(), **change))
    assert exc.value.field == field


def test_spark_asks_for_a_driver_and_its_executors_in_a_yarn_queue():
    spark = plugin_for("spark")
    params = {"memory_bytes": str(2 * 2**30), "executor_memory_bytes": str(4 * 2**30)}
    params["executor_instances"] = "3"
    r = spark.resource(params, {"executor_cpu_millis": "2000"})
    assert r.driver_part() == Resource.load_instance(2 * 2**30, 500, 1)
    assert r.yarn_part() == Resource.yarn("", 12 * 2**30, 6000, 1)
    effective = spark.params(params, {})
    assert effective["executor_instances"] == "3" and effective["max_idle_seconds"] == "600"
    with pytest.raises(InvalidParam) as exc:
        spark.resource({"executor_instances": "0"}, {})
    assert exc.value.field == "params.executor_instances"
    with pytest.raises(InvalidParam) as exc:
        plugin_for("shell").resource({"executor_instances": "2"}, {})  # spark's own only
    assert exc.value.field == "params.executor_instances"
    labels = (*ctx("spark").labels, Label.parse("cluster=prod"), Label.parse("yarnQueue=root.a.a1"))
    launch = spark.launch(replace(ctx("spark", **effective), labels=labels))
    assert launch.argv[launch.argv.index("--engine") + 1] == "python"  # the driver's session
    env = launch.environment
    assert env["LABELRM_YARN_CLUSTER"] == "prod"  # the queue: set by the flow at admission
    assert env["LABELRM_SPARK_EXECUTOR_INSTANCES"] == "3"
