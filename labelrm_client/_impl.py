"""The SDK's two clients and its label helpers, where rmctl and the package import them.

`AsyncRMClient` is written by hand (labelrm_client/_aio_*.py); `RMClient`, its blocking twin, is
generated from it by scripts/gen_sync_client.py (labelrm_client/_sync_*.py). Request builders
shared by both live in labelrm_client/_requests.py and labelrm_client/_engineconn.py.
"""

from __future__ import annotations

from labelrm_client._aio_client import AsyncRMClient
from labelrm_client._requests import (
    DEFAULT_TARGET,
    LabelsLike,
    StateLike,
    labels_text,
    parse_labels,
    ticket_state,
    to_labels,
)
from labelrm_client._sync_client import RMClient

__all__ = [
    "DEFAULT_TARGET",
    "AsyncRMClient",
    "LabelsLike",
    "RMClient",
    "StateLike",
    "labels_text",
    "parse_labels",
    "ticket_state",
    "to_labels",
]
