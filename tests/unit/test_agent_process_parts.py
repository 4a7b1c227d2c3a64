"""The pure parts of the agents' process (rm_server.agent_process): what the users'
process hands it, and how one scrape shows both processes' metrics."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rm_server.agent_process import child_settings, decode_settings, encode_settings
from rm_server.config import Settings
from rm_server.observability.metrics import Metrics


def test_the_child_gets_the_same_settings_on_the_resolved_database():
    mine = Settings(
        data_dir=Path("/srv/rm"),
        agent_listen="0.0.0.0:7101",
        console_listen="127.0.0.1:7180",
        metrics_listen="0.0.0.0:9100",
        ecm_expiry=12.5,
    )
    child = decode_settings(encode_settings(child_settings(mine, "host=/run/pg dbname=rm")))
    assert child.database_url == "host=/run/pg dbname=rm"
    assert child.console_listen == ""  # the console is the users' process's
    assert child.metrics_listen == "127.0.0.1:0"  # private: folded into the users' scrape
    assert child.data_dir == Path("/srv/rm") and child.ecm_expiry == 12.5
    assert child.agent_listen == mine.agent_listen
    assert decode_settings(encode_settings(child_settings(Settings(), "u"))).metrics_listen == ""


async def test_a_peers_samples_are_folded_in_labelled_by_process():
    child = Metrics(CollectorRegistry())
    child.for_method("labelrm.v1.ResourceManagerService/Heartbeat").end(False, "OK", "", 0.01)
    child.observe_pass("liveness", 0.02)
    mine = Metrics(CollectorRegistry())
    mine.for_method("labelrm.v1.ResourceManagerService/Apply").end(False, "OK", "", 0.01)
    mine.observe_pass("demand-planner", 0.03)

    async def fetch() -> bytes:
        return generate_latest(child.registry)

    mine.add_peer(fetch)
    families = {
        f.name: f for f in text_string_to_metric_families((await mine.exposition()).decode())
    }
    calls = {
        (s.labels["method"].rsplit("/", 1)[1], s.labels.get("process", "users"))
        for s in families["labelrm_rpc"].samples
        if s.name == "labelrm_rpc_total"
    }
    assert calls == {("Apply", "users"), ("Heartbeat", "agents")}
    passes = {
        (s.labels["job"], s.labels.get("process", "users"))
        for s in families["labelrm_background_pass_seconds"].samples
        if s.name.endswith("_count")
    }
    assert passes == {("demand-planner", "users"), ("liveness", "agents")}


async def test_a_peer_that_is_down_leaves_the_scrape_as_it_was():
    mine = Metrics(CollectorRegistry())

    async def down() -> bytes:
        return b""

    def names(text: bytes) -> set[str]:
        return {f.name for f in text_string_to_metric_families(text.decode())}

    alone = names(await mine.exposition())
    mine.add_peer(down)
    assert names(await mine.exposition()) == alone and "labelrm_rpc" in alone
