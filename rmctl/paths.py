"""Where rmctl keeps its files. Standard library only: shell completion reads them on
every TAB without loading the rest of rmctl."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "config_path"]


def config_path() -> Path:
    """The contexts file (rmctl/config.py): $LABELRM_CONFIG, else
    $XDG_CONFIG_HOME/labelrm/rmctl.toml (by default ~/.config/labelrm/rmctl.toml)."""
    given = os.environ.get("LABELRM_CONFIG")
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "labelrm" / "rmctl.toml"


def cache_dir() -> Path:
    """What completion keeps (its command tree, id lists): $XDG_CACHE_HOME/rmctl, by
    default ~/.cache/rmctl."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rmctl"
