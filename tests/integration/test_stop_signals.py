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
