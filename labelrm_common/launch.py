"""The parts of an EngineConn launch request that the RM's engine plugins build and the ECM
agent receives, as plain Python (the wire form is labelrm.v1.EngineConnLaunchRequest)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MaterialFile"]


@dataclass(frozen=True)
class MaterialFile:
    """A file the agent writes into the EngineConn's work directory before launch."""

    name: str
    content: bytes
    executable: bool = False
