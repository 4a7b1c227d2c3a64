"""The SDK's two clients and its label helpers, where rmctl and the package import them.

`AsyncRMClient` is written by hand (clients/_aio_*.py); `RMClient`, its blocking twin, is
generated from it by scripts/gen_sync_client.py (clients/_sync_*.py). Request builders
shared by both live in clients/_requests.py and clients/_engineconn.py.
"""

from __future__ import annotations

from clients._aio_client import AsyncRMClient
from clients._requests import (
    DEFAULT_TARGET,
    LabelsLike,
    StateLike,
    labels_text,
    parse_labels,
    ticket_state,
    to_labels,
)
from clients._sync_client import RMClient

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
