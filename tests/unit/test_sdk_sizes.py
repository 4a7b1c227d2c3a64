"""The SDK's memory= and cpu= of create_engine_conn / ask_engine_conn: the engine params
memory_bytes and cpu_millis, in the quantity syntax of labelrm_common/quantity.py."""

from __future__ import annotations

import inspect

import pytest

from labelrm_client import AsyncRMClient, RMClient
from labelrm_client._engineconn import create, sized


def test_quantities_become_the_engine_params() -> None:
    assert sized(None, "512Mi", "500m") == {"memory_bytes": 512 * 2**20, "cpu_millis": 500}
    assert sized({"max_idle_seconds": 60}, 2**30, 2) == {
        "max_idle_seconds": 60,
        "memory_bytes": 2**30,
        "cpu_millis": 2,  # an int is millicores already
    }
    assert sized({"cpu_millis": "250"}, None, None) == {"cpu_millis": "250"}
    request = create("userCreator=a-IDE,engineType=shell-1", "", sized(None, "1Gi", "2"), 30, None)
    assert dict(request.params) == {"memory_bytes": str(2**30), "cpu_millis": "2000"}


@pytest.mark.parametrize(
    ("params", "memory", "cpu", "message"),
    [
        ({}, "lots", None, "invalid memory quantity 'lots'"),
        ({}, None, "0.0001", "finer than a millicore"),
        ({"memory_bytes": "1"}, "1Gi", None, "memory_bytes given both as a param and as memory"),
        ({"cpu_millis": "1"}, None, "1", "cpu_millis given both as a param and as cpu"),
    ],
)
def test_bad_or_twice_given_sizes_are_refused(
    params: dict[str, str], memory: str | None, cpu: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        sized(params, memory, cpu)


@pytest.mark.parametrize("client", [AsyncRMClient, RMClient])
@pytest.mark.parametrize("method", ["create_engine_conn", "ask_engine_conn"])
def test_both_clients_take_memory_and_cpu(client: type, method: str) -> None:
    parameters = inspect.signature(getattr(client, method)).parameters
    assert {"memory", "cpu"} <= set(parameters)
