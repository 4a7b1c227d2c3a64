"""The installed labelrm version, for `--version` of rm-server, ecm-agent and rmctl."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("labelrm")
except PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0+unknown"
