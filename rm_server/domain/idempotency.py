"""What a mutating call carries so that a retry with the same request id replays the
first outcome, and how that outcome is stored (docs/architecture.md, "Idempotency").

Plain values, shared by the service layer (which builds them from a request) and the
store (which claims and finishes request ids in the call's transaction, storing each
outcome as the store's OutcomeEncoder says)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from rm_server.domain.errors import DomainError


@dataclass(frozen=True)
class Idempotency:
    """What a mutating call carries so that its retries replay the first outcome.

    The key is (caller, method, request_id): request ids are chosen by clients, so one
    caller's id never names another caller's request (nor replays its outcome)."""

    method: str
    request_id: str
    request_hash: bytes
    caller: str = ""  # the authenticated principal; "" for the server's own calls

    @staticmethod
    def of(method: str, request_id: str, payload: bytes, caller: str = "") -> Idempotency:
        return Idempotency(method, request_id, hashlib.sha256(payload).digest(), caller)

    def check_same(self, stored_hash: bytes) -> None:
        """Refuse a request id reused by its caller for a different request."""
        if stored_hash != self.request_hash:
            raise DomainError(
                "reused with a different request", "request_id", reason="REQUEST_ID_REUSED"
            )


@dataclass(frozen=True)
class Replay:
    """The stored outcome of an earlier call with the same request id."""

    status_code: int
    response: bytes
