"""ECM agent daemon: registers a host with the RM and launches EngineConns on it."""

from labelrm_common.version import VERSION as __version__

__all__ = ["__version__"]
