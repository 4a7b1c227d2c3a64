"""The SDK's old name, kept for one release: the SDK is `labelrm_client` now.

`import clients` warns (DeprecationWarning) and gives labelrm_client's objects themselves:
`clients.RMClient is labelrm_client.RMClient`, and `from clients._aio_rm import X` is
labelrm_client._aio_rm's X (every submodule of labelrm_client is registered under this
name too). Import `labelrm_client` instead; this package goes in a later release.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings

import labelrm_client
from labelrm_client import *  # noqa: F403  (the SDK's public names, its __all__)

__all__ = list(labelrm_client.__all__)

warnings.warn(
    "the SDK is labelrm_client now; `clients` goes in a later release",
    DeprecationWarning,
    stacklevel=2,
)


def _alias_submodules() -> None:
    """Register each labelrm_client.<name> as clients.<name> (sys.modules and attribute)."""
    this = sys.modules[__name__]
    for info in pkgutil.iter_modules(labelrm_client.__path__):
        module = importlib.import_module(f"labelrm_client.{info.name}")
        sys.modules[f"{__name__}.{info.name}"] = module
        setattr(this, info.name, module)


_alias_submodules()
