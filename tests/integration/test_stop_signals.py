"""A daemon's loop takes stop signals until the process is gone: `stop_signals`.

asyncio closes a loop's wake-up pipe before it removes the signal handlers that write to
it, so a stop signal that arrives while the loop closes printed a traceback ("Exception
ignored when trying to write to the signal wakeup fd ... Bad file descriptor"); one that
arrives after the handlers went killed the process or raised KeyboardInterrupt. Both
happen at every Ctrl-C of `make run`: the group takes SIGINT, and rm-server --dev also
sends its agent SIGTERM while that agent is already on its way out. Here a real process
is sent a stream of stop signals for the whole of its exit, on both loops."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

CHILD = """
import asyncio, sys, time
from labelrm_common.signals import stop_signals
from rm_server.main import run_on_loop

async def main():
    stopped = asyncio.Event()
    with stop_signals(stopped.set):
        print("ready", flush=True)
        await stopped.wait()
        print("stopping", flush=True)
        await asyncio.sleep(0.05)  # a drain, during which more signals come

run_on_loop(main(), sys.argv[1])
time.sleep(0.2)  # the rest of the process's exit, signals still coming
print("exited", flush=True)
"""


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_stop_signals_during_the_whole_exit_are_taken_quietly(event_loop: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, event_loop],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        sent = 0
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    break
                sent += 1
            time.sleep(0.001)  # a steady stream; a flood would only fill the wake-up pipe
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sent > 2, "the child exited before the signals came"
    assert (proc.returncode, err) == (0, ""), f"after {sent} signals:\n{err}"
    assert out == "stopping\nexited\n"


RM_SERVER = (sys.executable, "-m", "rm_server", "--listen", "127.0.0.1:0")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_rm_server_stops_on_a_signal_while_its_start_waits_for_the_database(
    tmp_path, sig: signal.Signals
) -> None:
    """A start can take long (the embedded database's first start, a database that does
    not answer): a stop signal cuts it short instead of waiting for it to end. Here the
    database accepts the connection and never answers, for up to a minute."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    log = tmp_path / "rm.log"
    url = f"host=127.0.0.1 port={port} user=postgres dbname=x connect_timeout=60"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*RM_SERVER, "--database-url", url, "--log-level", "INFO"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=os.getcwd(),
        )
    try:
        silent.settimeout(60)
        held, _ = silent.accept()  # its start is now waiting on the database
        started = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        held.close()
    finally:
        silent.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = log.read_text()
    assert code == 0, said
    assert "signal received while starting" in said, said
    assert "Traceback" not in said, said
    # Well inside the database's minute: the signal, not a timeout, ended the start.
    assert time.monotonic() - started < 30
