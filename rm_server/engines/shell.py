"""The ``shell`` engine: bash code run as the EngineConn's user by the engineconn runtime."""

from __future__ import annotations

from rm_server.engines.base import RuntimeEnginePlugin

PLUGIN = RuntimeEnginePlugin("shell")
