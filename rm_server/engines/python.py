"""The ``python`` engine: a persistent interpreter session in the engineconn runtime."""

from __future__ import annotations

from rm_server.engines.base import RuntimeEnginePlugin

PLUGIN = RuntimeEnginePlugin("python")
