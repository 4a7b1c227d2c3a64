"""The ``spark`` engine: a Spark-style EngineConn, a driver on the ECM plus executors in a YARN
queue (Apache Linkis' Spark engine asks for a DriverAndYarnResource the same way).

Its resource is ``driver_and_yarn``: the driver part is the EngineConn process on the ECM
(``memory_bytes``, ``cpu_millis``, one instance); the yarn part is the executors
(``executor_memory_bytes`` x ``executor_instances``, ``executor_cpu_millis`` x
``executor_instances``, one application) in the queue named by the request's
``yarnQueue=<queue>`` label, on the cluster named by its ``cluster=<name>`` label. The RM admits
the yarn part against that queue's live figures (rm_server/external).

The process itself is the labelrm EngineConn runtime's ``python`` session standing in for the
Spark driver; it gets the cluster and the executor sizes in its environment
(``LABELRM_YARN_CLUSTER``, ``LABELRM_SPARK_EXECUTOR_*``), and from the EngineConn flow the
queue it was admitted in (``LABELRM_YARN_QUEUE``, the full path), which a real driver would
pass to ``spark-submit --queue`` and ``--num-executors``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from rm_server.domain.external import CLUSTER_KEY
from rm_server.domain.resources import Resource
from rm_server.engines.base import (
    CPU_MILLIS,
    MEMORY_BYTES,
    PARAMS,
    IntParam,
    LaunchContext,
    LaunchRequest,
    RuntimeEnginePlugin,
    effective_params,
    resolve_params,
)

EXECUTOR_MEMORY = IntParam("executor_memory_bytes", 2**30, 1, 2**40)
EXECUTOR_CPU = IntParam("executor_cpu_millis", 1000, 1, 1024 * 1000)
EXECUTOR_INSTANCES = IntParam("executor_instances", 2, 1, 10_000)
SPARK_PARAMS: Mapping[str, IntParam] = MappingProxyType(
    {**PARAMS, **{p.name: p for p in (EXECUTOR_MEMORY, EXECUTOR_CPU, EXECUTOR_INSTANCES)}}
)
_DRIVER = RuntimeEnginePlugin("python")


@dataclass(frozen=True)
class SparkEnginePlugin:
    name: str = "spark"

    def params(self, params: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
        """The driver's params and the executors' (``executor_*``), defaults filled in."""
        return effective_params(params, defaults, SPARK_PARAMS)

    def resource(self, params: Mapping[str, str], defaults: Mapping[str, str]) -> Resource:
        """driver_and_yarn: the driver process, and the executors as one YARN application
        (its queue comes from the yarnQueue label at admission)."""
        v = resolve_params(params, defaults, SPARK_PARAMS)
        n = v[EXECUTOR_INSTANCES.name]
        driver = Resource.load_instance(v[MEMORY_BYTES.name], v[CPU_MILLIS.name], 1)
        executors = Resource.yarn("", v[EXECUTOR_MEMORY.name] * n, v[EXECUTOR_CPU.name] * n, 1)
        return Resource.driver_and_yarn(driver, executors)

    def launch(self, ctx: LaunchContext) -> LaunchRequest:
        """The runtime's python session as the driver, told its cluster and executors."""
        values = resolve_params(ctx.params, {}, SPARK_PARAMS)  # refuses unknown params
        driver_params = {k: v for k, v in ctx.params.items() if k in PARAMS}
        base = _DRIVER.launch(replace(ctx, engine=_DRIVER.name, params=driver_params))
        labels = {label.key: label.value for label in ctx.labels}
        environment = {
            **base.environment,
            "LABELRM_YARN_CLUSTER": labels.get(CLUSTER_KEY, ""),
            "LABELRM_SPARK_EXECUTOR_MEMORY_BYTES": str(values[EXECUTOR_MEMORY.name]),
            "LABELRM_SPARK_EXECUTOR_CPU_MILLIS": str(values[EXECUTOR_CPU.name]),
            "LABELRM_SPARK_EXECUTOR_INSTANCES": str(values[EXECUTOR_INSTANCES.name]),
        }
        return replace(base, environment=MappingProxyType(environment))


PLUGIN = SparkEnginePlugin()
