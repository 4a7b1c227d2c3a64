"""Engine plugins and their registry.

Adding an engine: write ``rm_server/engines/<name>.py`` defining ``PLUGIN`` (an
:class:`EnginePlugin`, usually a :class:`RuntimeEnginePlugin`), then add it to ``_ALL`` below.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from labelrm_common.launch import MaterialFile
from rm_server.engines import python, shell, spark
from rm_server.engines.base import (
    PARAMS,
    EnginePlugin,
    InvalidParam,
    LaunchContext,
    LaunchRequest,
    RuntimeEnginePlugin,
    effective_params,
    resolve_params,
)

_ALL: tuple[EnginePlugin, ...] = (
    shell.PLUGIN,
    python.PLUGIN,
    spark.PLUGIN,
)

PLUGINS: Mapping[str, EnginePlugin] = MappingProxyType({p.name: p for p in _ALL})


def plugin_for(engine: str) -> EnginePlugin:
    """The plugin for an engine type (the part of ``engineType`` before the '-')."""
    plugin = PLUGINS.get(engine)
    if plugin is None:
        known = ", ".join(sorted(PLUGINS))
        raise InvalidParam("labels", f"unknown engine type {engine!r}; known: {known}")
    return plugin


__all__ = [
    "PARAMS",
    "PLUGINS",
    "EnginePlugin",
    "InvalidParam",
    "LaunchContext",
    "LaunchRequest",
    "MaterialFile",
    "RuntimeEnginePlugin",
    "effective_params",
    "plugin_for",
    "resolve_params",
]
