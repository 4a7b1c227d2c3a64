"""The engines an EngineConn can run. Adding an engine is one module holding an
`Engine` subclass named `ENGINE`, plus its line in ENGINES."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engineconn.executor import Engine

# Engine name -> the module that defines it. Modules are imported only for the engine
# in use, so one engine's imports never slow down another's start-up.
ENGINES: dict[str, str] = {
    "shell": "engineconn.engines.shell",
    "python": "engineconn.engines.python",
}


def load_engine(name: str) -> type[Engine]:
    """The Engine class registered as `name`; KeyError if there is none."""
    module = importlib.import_module(ENGINES[name])
    engine: type[Engine] = module.ENGINE
    return engine
