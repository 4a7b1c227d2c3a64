"""The authentication step of the server's interceptor (rm_server/service/interceptor.py):
authenticates every call, applies the policy table and the abuse limits, and puts the
caller's `Principal` in a context variable.

Order of checks (each refusal raises before the call's servicer runs, so it changes
nothing; the interceptor turns the error into the call's status):

1. public methods (health, reflection) pass untouched;
2. the principal, from the call's metadata and TLS session only (`admit_caller`, before
   a byte of the request is read): a valid bearer token (always accepted), else the
   verified client certificate, else anonymous. An invalid token is UNAUTHENTICATED and counts as a
   failure of its peer; once a peer has too many recent failures, its further invalid
   tokens are refused RESOURCE_EXHAUSTED (a valid token from the same address never is:
   a guesser must not lock out the users and admins behind the same address);
3. a user's rate of calls (every RPC; admins exempt), and that of the user's
   EngineConns (their certificates' calls): RESOURCE_EXHAUSTED, before the policy,
   whose ownership checks read the database;
4. the caller's role against the policy table (`policy.check_role`): UNAUTHENTICATED /
   PERMISSION_DENIED, still before the request is read: an anonymous caller's bytes,
   or a user's sent to an agent's method, are never parsed;
5. (`admit`, once the server's interceptor has read the request: its size on the wire
   for user RPCs, then its counts and sizes, `service.bounds`) the policy's ownership
   check on the request (`policy.authorize`);
6. the per-user limits of apply-like calls: RESOURCE_EXHAUSTED.

With authentication off (dev mode on loopback) the step is left out of every handler:
every caller is an admin (`identity.DEV_ADMIN`) and nothing is checked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

import grpc

from rm_server.domain.labels import DEFAULT_RULES, TransformRule
from rm_server.domain.text import short
from rm_server.errors import PermissionDenied, Unauthenticated
from rm_server.security import policy
from rm_server.security.identity import (
    ANONYMOUS,
    BadCredentials,
    Principal,
    bearer_token,
    from_auth_context,
    from_token_entry,
    peer_host,
    principal_var,
)
from rm_server.security.limits import Limits, RateKeys
from rm_server.security.tokens import TokenFile

log = logging.getLogger(__name__)

Release = Callable[[], None]


def _waits(request: Any) -> bool:
    wait = getattr(request, "wait_timeout", None)
    return wait is not None and (wait.seconds > 0 or wait.nanos > 0)


class AuthInterceptor:
    """Authentication, authorization and limits for every RPC (see the module doc)."""

    def __init__(
        self,
        *,
        enabled: bool,
        tokens: TokenFile | None,
        owners: policy.Owners,
        limits: Limits,
        proxy_users: Collection[str] = (),
        allow_host_certificates: bool = False,
        rules: Sequence[TransformRule] = DEFAULT_RULES,
    ) -> None:
        self.enabled = enabled
        self.allow_host_certificates = allow_host_certificates
        self.tokens = tokens
        self.owners = owners
        self.limits = limits
        self.rate_keys = RateKeys(owners)  # whose call rate each caller's calls count against
        self.proxy_users = frozenset(proxy_users)
        self.rules = tuple(rules)  # which label combinations charge a user

    def guards(self, method: str) -> bool:
        """Whether calls of `method` go through `admit` (not with authentication off, nor
        for the public methods)."""
        return self.enabled and not policy.is_public(method)

    def checks_each_message(self, method: str) -> bool:
        """Whether `method`'s client streams requests that `admit_message` checks one by
        one (the policy's ``per_message``): the only such calls served when guarded."""
        rule = policy.rule_for(method)
        return rule is not None and rule.per_message

    # ----- the checks --------------------------------------------------------------------

    def principal_of_token(self, token: str, peer: str) -> Principal:
        """Who a bearer token names, for every listener that takes tokens (the RPCs and the
        web console). An invalid token is refused, and counted against its `peer`'s
        address: a valid token is always accepted, whatever else came from that address,
        so only guessing is throttled (a guesser cannot lock others out)."""
        valid = self.tokens.find(token) if self.tokens is not None else None
        if valid is None:
            self.limits.check_peer(peer)
            self.limits.auth_failed(peer)
            log.warning("invalid bearer token from %s", peer)
            raise Unauthenticated("invalid bearer token", reason="INVALID_TOKEN")
        key, entry = valid
        return from_token_entry(entry.user, entry.roles, credential=key)

    def _authenticate(self, context: grpc.aio.ServicerContext) -> Principal:
        token = bearer_token(context.invocation_metadata())
        if token is not None:
            return self.principal_of_token(token, peer_host(str(context.peer() or "")))
        try:
            found = from_auth_context(context.auth_context(), self.allow_host_certificates)
        except BadCredentials as exc:
            raise Unauthenticated(str(exc), reason="BAD_CERTIFICATE") from exc
        return found if found is not None else ANONYMOUS

    async def admit_caller(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """Authenticate one call and judge its caller, before a byte of its request is
        read: credentials, the caller's rate of calls, and whether its role may call
        `method` at all (anonymous bytes are refused unread, whatever their size).
        Raises a LabelrmError when refused."""
        principal = self._authenticate(context)
        # Set before the checks: the access log names the caller of a refused call too.
        principal_var.set(principal)
        # Before the policy, whose ownership checks read the database.
        await self.rate_keys.admit(self.limits, principal)
        self._refusal_logged(lambda: policy.check_role(method, principal))

    async def admit(self, method: str, request: Any) -> Release:
        """Authorize the request of a call `admit_caller` let in (the policy's ownership
        check, then the apply-like limits); raises a LabelrmError when refused, else
        returns what to call when the call ends (the limits' release). For a call whose
        client streams its requests, `request` is None (each message goes through
        `admit_message`)."""
        principal = principal_var.get()
        if principal is None:  # admit_caller runs first, in the same task: never here
            raise Unauthenticated(f"{method}: the caller was not authenticated")
        rule = await self._authorize(method, principal, request)
        if rule is None or not rule.apply_like or principal.is_admin:
            return _nothing
        user = str(getattr(request, "user", "") or principal.name)
        return self.limits.admit(user, _waits(request))

    async def admit_message(self, method: str, message: Any) -> None:
        """Check one message of a call whose client streams its requests, against the
        rule of `method` (``per_message``), for the caller `admit` let in: its token
        must still be valid, and the message its own."""
        principal = principal_var.get()
        if principal is None:  # admit runs first, in the same task: never here
            raise Unauthenticated(f"{method}: the call was not admitted")
        self._recheck(principal)
        await self._authorize(method, principal, message)

    def stream_check(self) -> Callable[[], None] | None:
        """For the call `admit` just let in: what to call before each message it sends
        (raises Unauthenticated once the caller's token is revoked), or None when the
        caller holds no revocable credential (a certificate)."""
        principal = principal_var.get()
        if principal is None or not principal.credential or self.tokens is None:
            return None
        return lambda: self._recheck(principal)

    # How often an idle stream re-checks its token, in seconds (a message to send is
    # re-checked when it comes, whatever the time).
    recheck_interval = 1.0

    def _recheck(self, principal: Principal) -> None:
        """Unauthenticated unless the token `principal` came with still stands as it did
        (revoked, its roles changed, the file unusable: the stream ends)."""
        if not principal.credential or self.tokens is None:
            return
        entry = self.tokens.current(principal.credential)
        if entry is None or entry.user != principal.name or entry.roles != principal.roles:
            log.warning("%s: token revoked, ending its stream", principal.describe())
            raise Unauthenticated(
                "the bearer token of this call was revoked", reason="TOKEN_REVOKED"
            )

    async def _authorize(
        self, method: str, principal: Principal, request: Any
    ) -> policy.Rule | None:
        """The policy's verdict on `request` (a refusal is logged, then raised)."""
        try:
            return await policy.authorize(
                method, principal, request, self.owners, self.proxy_users, self.rules
            )
        except PermissionDenied as err:
            log.info("refused: %s", short(err.message, 300))
            raise

    @staticmethod
    def _refusal_logged(check: Callable[[], object]) -> None:
        """Run a policy check, logging a PermissionDenied (one line) before it propagates."""
        try:
            check()
        except PermissionDenied as err:
            log.info("refused: %s", short(err.message, 300))
            raise


def _nothing() -> None:
    return None
