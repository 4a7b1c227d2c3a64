"""ecm-agent as an operator runs it: a real process, real signals, a real (or missing) RM."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
from asyncio.subprocess import PIPE, STDOUT
from pathlib import Path

import pytest

from bench.serving import free_port
from tests.support.env import ROOT
from tests.support.waiting import wait_until_sync


def agent_cmd(tmp: Path, *extra: str, rm: str = "") -> list[str]:
    (tmp / "work").mkdir(exist_ok=True)
    return [
        sys.executable, "-m", "ecm_agent",
        "--rm", rm or f"127.0.0.1:{free_port()}",  # nothing listens there
        "--agent-id", "a1",
        "--work-root", str(tmp / "work"),
        "--state-dir", str(tmp / "state"),
        "--isolation", "none",  # (the signals and settings of the daemon, not its cgroups)
        *extra,
    ]  # fmt: skip


def run_agent(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_cmd(tmp, *extra), capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stops_on_a_signal_while_the_rm_is_unreachable(tmp_path: Path, sig: int) -> None:
    """The agent retries an unreachable RM with one log line per retry and a growing
    pause, and a signal stops it at once (it used to ignore SIGTERM while retrying)."""
    log = tmp_path / "agent.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(agent_cmd(tmp_path), stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_until_sync(lambda: log.read_text().count(" unreachable ") >= 3, 60, interval=0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = log.read_text().splitlines()
    retries = [line for line in lines if " unreachable " in line]
    assert all("level=WARNING" in line and "UNAVAILABLE" in line for line in retries)
    assert all(line.startswith("ts=") and " logger=" in line for line in lines), lines
    pauses = [float(line.rsplit(" in ", 1)[1].rstrip('"').rstrip("s")) for line in retries]
    assert [int(line.split(" retry ")[1].split()[0]) for line in retries] == list(
        range(1, len(retries) + 1)
    )
    assert all(p > 0 for p in pauses) and pauses[2] > pauses[0]  # backing off
    # Every line is a log record: no multi-line error dumps, no traceback.
    assert "Traceback" not in log.read_text()
    assert lines[-1].endswith('msg="stopped while waiting for the RM"')


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--tls-ca", "/nonexistent/ca.crt"), "tls_ca /nonexistent/ca.crt: No such file"),
        (("--tls-cert", "/nonexistent/a.crt", "--tls-key", "/nonexistent/a.key"), "tls_cert"),
        (("--state-dir", "/proc/version/state"), "state_dir /proc/version/state"),
        (("--work-root", "/nonexistent/work"), "work_root /nonexistent/work: its parent /non"),
        (("--work-root", "/proc/version"), "work_root /proc/version: not a directory"),
        (("--python", "/nonexistent/python"), "python /nonexistent/python"),
        (("--heartbeat-interval", "often"), "invalid value 'often' for heartbeat_interval"),
        (("--log-level", "loud"), "log_level must be one of"),
        (("--config", "/nonexistent/agent.toml"), "cannot read config file"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(
    tmp_path: Path, extra: tuple[str, ...], expected: str
) -> None:
    """Checked before registering: an agent that cannot launch never reports RUNNING."""
    done = run_agent(tmp_path, *extra)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("ecm-agent: error: ") and expected in done.stderr


def test_unknown_key_in_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('rm = "127.0.0.1:1"\nwork_dir = "/x"\n')
    done = run_agent(tmp_path, "--config", str(config))
    assert (done.returncode, done.stderr) == (
        2,
        f"ecm-agent: error: unknown setting 'work_dir' in {config}\n",
    )


def test_help_print_config_and_version(tmp_path: Path) -> None:
    done = run_agent(tmp_path, "--help")
    assert done.returncode == 0
    assert "--work-root WORK_ROOT" in done.stdout and "EngineConn work directories" in done.stdout
    assert "[LABELRM_AGENT_STATE_DIR]" in done.stdout
    config = tmp_path / "agent.toml"
    config.write_text('labels = "cluster=c1"\ntoken = "secret-token"\n')
    env = {**os.environ, "LABELRM_AGENT_KILL_GRACE": "9"}
    done = subprocess.run(
        agent_cmd(tmp_path, "--config", str(config), "--print-config"),
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = {line.split(" = ")[0]: line for line in done.stdout.splitlines() if " = " in line}
    assert shown["labels"].startswith('labels = "cluster=c1"  # file')
    assert shown["kill_grace"].startswith("kill_grace = 9.0  # env (LABELRM_AGENT_KILL_GRACE")
    assert shown["agent_id"].startswith('agent_id = "a1"  # flag')
    assert "secret-token" not in done.stdout and 'token = "***"' in done.stdout
    done = run_agent(tmp_path, "--version")
    assert done.returncode == 0 and done.stdout.startswith("ecm-agent ")


def test_json_log_lines(tmp_path: Path) -> None:
    """--log-format json: every line one JSON object, as rm-server writes them."""
    import json

    log = tmp_path / "agent.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            agent_cmd(tmp_path, "--log-format", "json"),
            stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    try:
        wait_until_sync(lambda: log.read_text().count("unreachable") >= 2, 60, interval=0.05)
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events and all(e["level"] in ("INFO", "WARNING") for e in events)
    assert any("unreachable" in e["msg"] for e in events)


def shipped_config_under(root: Path) -> Path:
    """deploy/ecm-agent.toml with its host paths moved under `root` (/etc/labelrm,
    /var/lib/labelrm) and the EngineConn interpreter this one; nothing else changed."""
    text = (ROOT / "deploy" / "ecm-agent.toml").read_text()
    for prefix in ("/etc/labelrm/", "/var/lib/labelrm/"):
        assert f'"{prefix}' in text, prefix
        text = text.replace(f'"{prefix}', f'"{root}{prefix}')
    text = text.replace('"/opt/labelrm/ec-venv/bin/python"', f'"{sys.executable}"')
    config = root / "etc" / "labelrm" / "ecm-agent.toml"
    config.parent.mkdir(parents=True)
    config.write_text(text)
    return config


def pki_as_documented(tls: Path) -> None:
    """The CA, the RM's and the agent's certificates, as docs/security.md makes them
    (the RM's for 127.0.0.1, where this test's RM listens)."""
    for argv in (
        ("init",),
        ("issue", "server", "rm1", "--ip", "127.0.0.1"),
        ("issue", "agent", "worker-1"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "rmctl", "pki", argv[0], "--dir", str(tls), *argv[1:]],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


async def test_the_shipped_config_makes_its_directories_and_registers(
    database_url: str, tmp_path: Path
) -> None:
    """A literal install: deploy/ecm-agent.toml as shipped (its paths under a scratch
    root), with only the parent that the unit's StateDirectory= makes. Without that
    parent the agent refuses in one line (exit 2); with it, the agent makes work_root
    (0755) and state_dir (0700), its own, whatever its umask, and registers over mutual
    TLS. It used to exit 2 on every start ("work_root ...: not a directory"), which
    systemd's Restart=on-failure repeated forever."""
    from labelrm.v1 import resource_manager_pb2, resource_manager_pb2_grpc

    from labelrm_client._channel import ChannelSecurity, aio_channel
    from labelrm_common.tokens import add_token
    from tests.support.rm import start_in_process, stop_in_process
    from tests.support.waiting import wait_until

    root = tmp_path / "host"
    config = shipped_config_under(root)
    tls = root / "etc" / "labelrm" / "tls"
    pki_as_documented(tls)
    state_root = root / "var" / "lib" / "labelrm"
    work, state = state_root / "work", state_root / "agent-state"
    tokens = tmp_path / "tokens.toml"
    admin = add_token(tokens, "admin", ["admin"])
    rm = await start_in_process(
        database_url,
        agent_listen="127.0.0.1:0",
        tls_cert=str(tls / "server-rm1.crt"),
        tls_key=str(tls / "server-rm1.key"),
        tls_client_ca=str(tls / "ca.crt"),
        token_file=str(tokens),
    )
    agent_target = f"127.0.0.1:{rm.server.agent_port}"
    # The shipped file names rm.example.internal and no agent_id (the host name): the
    # two values an operator fills in per host, given here as the environment; and
    # isolation none (the daemon's directories here, not its cgroups).
    env = {
        **os.environ,
        "LABELRM_AGENT_RM": agent_target,
        "LABELRM_AGENT_AGENT_ID": "worker-1",
        "LABELRM_AGENT_ISOLATION": "none",
    }
    ecm_agent = str(Path(sys.executable).parent / "ecm-agent")
    command = [ecm_agent, "--config", str(config)]
    log = tmp_path / "agent.log"
    proc = None
    try:
        refused = await asyncio.create_subprocess_exec(
            *command, stdout=PIPE, stderr=PIPE, cwd="/", env=env
        )
        out, err = await asyncio.wait_for(refused.communicate(), 60)
        assert refused.returncode == 2, err
        assert (out, err.decode()) == (
            b"",
            f"ecm-agent: error: work_root {work}: its parent {state_root} does not exist"
            " (create it, or fix work_root)\n",
        )
        state_root.mkdir(parents=True, mode=0o755)  # what StateDirectory=labelrm makes
        with log.open("wb") as sink:
            proc = await asyncio.create_subprocess_exec(
                *command, stdout=sink, stderr=STDOUT, cwd="/", env=env, umask=0o077
            )
        security = ChannelSecurity(tls_ca=str(tls / "ca.crt"), token=admin)
        async with aio_channel(f"127.0.0.1:{rm.server.port}", security) as channel:
            stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)

            async def registered() -> bool:
                ecms = (await stub.ListEcms(resource_manager_pb2.ListEcmsRequest())).ecms
                return any(e.instance == "worker-1" for e in ecms)

            await wait_until(registered, 60, what=lambda: "worker-1 registered\n" + log.read_text())
        assert proc.returncode is None, log.read_text()
        for path, mode in ((work, 0o755), (state, 0o700)):
            info = path.stat()
            assert (stat.S_IMODE(info.st_mode), info.st_uid) == (mode, os.geteuid()), path
    finally:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 20)
        await stop_in_process(rm)
