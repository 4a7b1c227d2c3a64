"""A Spark-style EngineConn (driver on an ECM, executors in a YARN queue) created end to end:
a real agent launching through real sudo, admitted or refused against the live figures of
the stand-in YARN RM (tests/yarn_standin.py)."""

from __future__ import annotations

import grpc
import pytest
from labelrm.v1 import admin_pb2, external_pb2

from tests.integration.test_engineconns import create, execute
from tests.support.agents import start_agent
from tests.support.messages import GiB
from tests.support.rm import assert_consistent, label_state
from tests.yarn_standin import HAPair, capacity_cluster

# The queue by its leaf name: the EngineConn is told the full path it was admitted in.
SPARK = "userCreator=lrmtest_a-IDE,engineType=spark-3.2.1,cluster=prod,yarnQueue=a1"
QUEUE = "cluster=prod,yarnQueue=root.a.a1"


async def test_spark_engineconn_is_admitted_or_refused_against_the_live_queue(
    cluster_rm, agent_factory
):
    rm = cluster_rm
    state = capacity_cluster()  # root.a.a1 may grow to 60 GiB of the cluster's 100
    pair = HAPair(state)
    try:
        await rm.admin.PutExternalProvider(
            admin_pb2.PutExternalProviderRequest(
                provider=external_pb2.ExternalProvider(
                    name="prod-yarn",
                    cluster="prod",
                    addresses=pair.addresses,
                    cache_ttl_seconds=0,
                )
            )
        )
        await start_agent(rm, agent_factory, "agent1", "--labels", "cluster=prod")
        state.start_app("root.a.a1", 50 * 1024, 10)  # other YARN users: 10 GiB left

        with pytest.raises(grpc.aio.AioRpcError) as refused:  # 3 x 4 GiB executors
            await create(rm, SPARK, executor_memory_bytes=4 * GiB, executor_instances=3)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert QUEUE in refused.value.details()
        assert "YARN used 53687091200" in refused.value.details()

        ec = await create(rm, SPARK, executor_memory_bytes=4 * GiB, executor_instances=2)
        out, _, code = await execute(
            ec,
            "import os; print(os.environ['LABELRM_YARN_QUEUE'], os.environ['LABELRM_YARN_CLUSTER'])",
        )
        assert (out.strip(), code) == ("root.a.a1 prod", 0)
        queue = await label_state(rm, QUEUE)
        assert queue.live_tickets == 1
        yarn = queue.used_resource.yarn  # the yarn part, reported used once ready
        assert yarn.queue_memory_bytes == 8 * GiB and yarn.queue_name == "root.a.a1"
        await assert_consistent(rm)
    finally:
        pair.stop()
