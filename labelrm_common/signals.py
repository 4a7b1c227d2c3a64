"""SIGTERM and SIGINT for a daemon's event loop, safe until the process exits.

asyncio's ``loop.close()`` closes the loop's wake-up pipe before it removes the signal
handlers that write to it. A stop signal in between makes the interpreter print
"Exception ignored when trying to write to the signal wakeup fd ... Bad file descriptor"
with a traceback. Second stop signals are ordinary at exit: a Ctrl-C reaches the whole
process group, and a parent that drains its children also sends them SIGTERM, so a child
that is already on its way out can take one while its loop closes.

`stop_signals` therefore removes the handlers while the loop still runs, and the process
ignores further stop signals for the little that is left of its life: it is stopping
already.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_signals(callback: Callable[..., object], *args: object) -> Iterator[None]:
    """Call ``callback(*args)`` on the running loop for every SIGTERM or SIGINT that
    arrives while the block runs; from its end on, the process ignores both.

    Use it around the whole of a process's main coroutine, not a part: the signals stay
    ignored afterwards, and children started later inherit that.
    """
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, callback, *args)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)
