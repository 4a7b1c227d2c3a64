"""The adapters' errors: one root, FetchFailed, for a provider that did not answer as it
should. The use case (rm_server/app/providers.py) turns each into the RM's refusal; the
adapters never pick a status."""

from __future__ import annotations


class FetchFailed(Exception):
    """A provider's figures could not be fetched."""


class RMUnreachable(FetchFailed):
    """No active ResourceManager answered (all down, all standby, or errors)."""


class RMAuthRejected(FetchFailed):
    """The RM refused the provider's credentials (HTTP 401/403)."""
