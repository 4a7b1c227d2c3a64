"""The shell engine: each execution is `bash -c CODE`, run as the EngineConn's user in
the EngineConn's work directory, in a process group of its own."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import signal

from engineconn.executor import STDERR, STDOUT, Emit, Engine, Outcome, Output

log = logging.getLogger(__name__)

_READ_SIZE = 64 * 1024
# After TERM, the group gets this long before KILL.
KILL_GRACE_SECONDS = 2.0


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    # The group may already be gone (everything exited): nothing to do then.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class ShellEngine(Engine):
    """Runs bash code. Cancel and timeout stop the whole process group: TERM, then
    KILL after KILL_GRACE_SECONDS. When bash itself exits, whatever it left running in
    its group is stopped the same way: an execution's processes do not outlive it
    (they would escape the agent's kill, being in another process group)."""

    name = "shell"

    async def run(self, code: str, emit: Emit, cancel: asyncio.Event) -> Outcome:
        """Runs `bash -c code`, streaming stdout and stderr as they come."""
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            code,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            process_group=0,  # its own group, so that a kill reaches its children too
        )
        pgid = proc.pid
        assert proc.stdout is not None and proc.stderr is not None
        readers = {
            asyncio.create_task(_pump(proc.stdout, STDOUT, emit)),
            asyncio.create_task(_pump(proc.stderr, STDERR, emit)),
        }
        try:
            exited = asyncio.create_task(proc.wait())
            cancelled = asyncio.create_task(cancel.wait())
            await asyncio.wait({exited, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            cancelled.cancel()
            if not exited.done():
                await _stop_group(pgid, exited)
            returncode = await exited
            # Leftovers holding the pipes open would keep the stream from ending.
            _signal_group(pgid, signal.SIGTERM)
            _, pending = await asyncio.wait(readers, timeout=KILL_GRACE_SECONDS)
            if pending:
                _signal_group(pgid, signal.SIGKILL)
                _, pending = await asyncio.wait(pending, timeout=1.0)
                for reader in pending:  # a pipe passed to another session: give up on it
                    reader.cancel()
        except BaseException:
            # Never leave a process group behind, whatever happened to us.
            _signal_group(pgid, signal.SIGKILL)
            for reader in readers:
                reader.cancel()
            raise
        # Report death by a signal as bash does: 128 + the signal number.
        exit_code = returncode if returncode >= 0 else 128 - returncode
        return Outcome(exit_code=exit_code)


async def _stop_group(pgid: int, exited: asyncio.Task[int]) -> None:
    log.info("stopping process group %d", pgid)
    _signal_group(pgid, signal.SIGTERM)
    await asyncio.wait({exited}, timeout=KILL_GRACE_SECONDS)
    if not exited.done():
        _signal_group(pgid, signal.SIGKILL)


async def _pump(pipe: asyncio.StreamReader, stream: str, emit: Emit) -> None:
    # Incremental decoding: a UTF-8 character split across two reads stays whole.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        data = await pipe.read(_READ_SIZE)
        text = decoder.decode(data, final=not data)
        if text:
            await emit(Output(stream, text))
        if not data:
            return


ENGINE = ShellEngine
