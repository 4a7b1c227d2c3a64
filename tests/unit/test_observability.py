"""Structured logs and their per-RPC context, configuration precedence and sources,
and the small pure helpers of the metrics module (no server, no database)."""

from __future__ import annotations

import io
import json
import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from labelrm_common.logging import make_handler
from rm_server.config import Settings, load_config, redact_url
from rm_server.observability.endpoint import split_host_port
from rm_server.observability.metrics import apply_outcome
from rm_server.service.interceptor import Interceptor

# --- logs --------------------------------------------------------------------------------


@dataclass
class FakeContext:
    """The part of grpc.aio.ServicerContext the interceptor uses."""

    peer_name: str = "ipv4:127.0.0.1:50000"
    status: object = None
    trailing: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    def peer(self) -> str:
        return self.peer_name

    def code(self) -> object:
        return self.status

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self.trailing

    async def abort_with_status(self, status) -> None:
        self.status, self.trailing = status.code, status.trailing_metadata
        raise grpc.aio.AbortError()


@dataclass
class Req:
    request_id: str = ""


class Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


async def call(
    behavior: Any, request: Any, context: Any = None, method: str = "labelrm.v1.X/Apply"
) -> Any:
    """Run `behavior` as the server's interceptor runs a unary call of `method`."""
    service, name = method.split("/")
    calls = Interceptor()
    calls.add_registered_method_handlers(
        service, {name: grpc.unary_unary_rpc_method_handler(behavior)}
    )
    handler = calls.service(Details("/" + method))
    assert handler is not None, method
    return await handler.unary_unary(request, context or FakeContext())


@pytest.fixture
def captured():
    """A structured handler on a private stream, attached to a private logger tree (the
    root's handlers belong to pytest's capture)."""
    streams = {}

    def attach(fmt: str) -> io.StringIO:
        stream = io.StringIO()
        handler = make_handler(fmt, stream)
        for name in ("labelrm.access", "rm_server.somewhere"):
            logger = logging.getLogger(name)
            logger.addHandler(handler)
            logger.setLevel(logging.DEBUG)
        streams[fmt] = (stream, handler)
        return stream

    yield attach
    for _, handler in streams.values():
        for name in ("labelrm.access", "rm_server.somewhere"):
            logging.getLogger(name).removeHandler(handler)


async def test_json_lines_carry_request_id_and_peer_for_every_line_of_an_rpc(captured):
    stream = captured("json")
    other = logging.getLogger("rm_server.somewhere")
    other.info("before any call")

    async def apply(request, context):
        other.info("inside the call: %s", "detail", extra={"ticket": "t-1"})
        return "done"

    assert await call(apply, Req("req-42")) == "done"
    other.info("after the call")
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["msg"] for e in events] == [
        "before any call",
        "inside the call: detail",
        "rpc",
        "after the call",
    ]
    inside, access = events[1], events[2]
    for event in (inside, access):
        assert event["request_id"] == "req-42"
        assert event["peer"] == "ipv4:127.0.0.1:50000"
        assert event["method"] == "labelrm.v1.X/Apply"
    assert inside["ticket"] == "t-1" and inside["logger"] == "rm_server.somewhere"
    assert access["event"] == "rpc" and access["code"] == "OK" and access["duration_ms"] >= 0
    assert "request_id" not in events[0] and "request_id" not in events[3]
    assert events[0]["ts"].endswith("Z") and events[0]["level"] == "INFO"


async def test_calls_without_request_id_get_a_generated_one(captured):
    stream = captured("json")

    async def get_ticket(request, context):
        logging.getLogger("rm_server.somewhere").info("looking")
        raise RuntimeError("boom")

    with pytest.raises(grpc.aio.AbortError):
        await call(get_ticket, Req(""), method="labelrm.v1.X/GetTicket")
    inside, access = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert access["request_id"].startswith("srv-")
    assert inside["request_id"] == access["request_id"]  # one id for the whole call
    assert access["code"] == "INTERNAL"  # an unexpected error: logged, then INTERNAL


async def test_text_format_is_logfmt_one_line_per_event_even_with_a_traceback(captured):
    stream = captured("text")
    log = logging.getLogger("rm_server.somewhere")

    async def apply(request, context):
        try:
            raise ValueError("bad\nthing")
        except ValueError:
            log.exception("failed with %s", "x")

    await call(apply, Req("r 1"))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # the error (traceback included) and the rpc event
    assert lines[0].startswith("ts=") and " level=ERROR " in lines[0]
    assert 'msg="failed with x"' in lines[0] and 'request_id="r 1"' in lines[0]
    assert "peer=ipv4:127.0.0.1:50000" in lines[0] and "exc=" in lines[0]
    assert "msg=rpc" in lines[1] and "code=OK" in lines[1]


def test_unknown_log_format_is_refused():
    with pytest.raises(ValueError):
        make_handler("xml")
    with pytest.raises(SystemExit):
        load_config(["--log-format", "xml"], {})


# --- config ------------------------------------------------------------------------------


def test_precedence_default_file_env_flag(tmp_path: Path):
    config = tmp_path / "rm.toml"
    config.write_text('pool-max = 5\npool_min = 3\nlisten = "0.0.0.0:7000"\nlog_format = "json"\n')
    env = {
        "LABELRM_CONFIG": str(config),
        "LABELRM_POOL_MAX": "7",
        "LABELRM_LISTEN": "127.0.0.1:7001",
    }
    loaded = load_config(["--listen", "127.0.0.1:7002", "--lock-timeout", "30"], env)
    s = loaded.settings
    assert s.pool_min == 3 and loaded.sources["pool_min"] == "file"  # file only
    assert s.pool_max == 7 and loaded.sources["pool_max"] == "env"  # env beats file
    assert s.listen == "127.0.0.1:7002" and loaded.sources["listen"] == "flag"  # flag beats both
    assert s.lock_timeout == 30.0 and loaded.sources["lock_timeout"] == "flag"
    assert s.log_format == "json" and loaded.sources["log_format"] == "file"
    assert s.sweep_interval == Settings().sweep_interval and "sweep_interval" not in loaded.sources
    assert loaded.config_file == str(config) and not loaded.print_config


def test_print_config_output_is_toml_with_sources(tmp_path: Path):
    config = tmp_path / "rm.toml"
    config.write_text("pool_max = 5\n")
    loaded = load_config(
        ["--config", str(config), "--print-config", "--database-url", "postgresql://u:pw@h/db"],
        {"LABELRM_SWEEP_INTERVAL": "2.5"},
    )
    assert loaded.print_config
    text = loaded.describe()
    assert "pool_max = 5  # file" in text
    assert "sweep_interval = 2.5  # env (LABELRM_SWEEP_INTERVAL, --sweep-interval)" in text
    assert 'listen = "127.0.0.1:7100"  # default' in text
    assert "pw" not in text and "postgresql://u:***@h/db" in text
    parsed = tomllib.loads(text)  # the output can serve as a config file
    assert parsed["pool_max"] == 5 and parsed["sweep_interval"] == 2.5
    assert set(parsed) == {f for f in Settings.__dataclass_fields__}


def test_bad_values_are_usage_errors(tmp_path: Path):
    with pytest.raises(SystemExit):
        load_config(["--pool-max", "many"], {})
    bad = tmp_path / "bad.toml"
    bad.write_text("nonsense = 1\n")
    with pytest.raises(SystemExit):
        load_config(["--config", str(bad)], {})


def test_redact_url():
    assert redact_url("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_url("host=h password=secret user=u") == "host=h password=*** user=u"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"


# --- metrics helpers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason", "outcome"),
    [
        ("OK", "", "granted"),
        ("RESOURCE_EXHAUSTED", "INSUFFICIENT_RESOURCE", "insufficient_resource"),
        ("RESOURCE_EXHAUSTED", "QUEUED_BEHIND_WAITERS", "queued_behind_waiters"),
        ("DEADLINE_EXCEEDED", "WAIT_TIMEOUT", "wait_timeout"),
        ("CANCELLED", "", "cancelled"),
        ("INTERNAL", "not a reason!", "internal"),
    ],
)
def test_apply_outcome(code, reason, outcome):
    assert apply_outcome(code, reason) == outcome


def test_split_host_port():
    assert split_host_port("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert split_host_port("[::1]:0") == ("::1", 0)
    assert split_host_port(":9100") == ("0.0.0.0", 9100)
    with pytest.raises(ValueError):
        split_host_port("9100")
