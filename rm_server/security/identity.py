"""Who is calling: the `Principal` of an RPC, from a verified TLS client certificate or
an ``authorization: Bearer <token>`` header.

Certificates: the URI SAN ``labelrm://<kind>/<name>`` (what `rmctl pki` and the RM's
EngineConn issuer write) names the kind and the identity. A certificate without one
(issued by an operator's own CA for a host, which may also issue certificates for
anything else) proves no labelrm identity and is refused, unless the operator allows
named host certificates (setting ``allow_host_certificates``): then it is an agent
whose identities are its CN and its DNS names. gRPC has verified the chain before any RPC runs; this
module only reads what the handshake proved.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from labelrm_common.pki import URI_SCHEME
from labelrm_common.roles import Role


class Kind(StrEnum):
    USER = "user"
    AGENT = "agent"
    ENGINECONN = "engineconn"
    ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller (or the anonymous one).

    `names` lists every identity the caller may claim: an agent certificate may name
    its host in the CN and in DNS SANs, and the agent id it registers with is any one
    of them. `via` says how it was authenticated (for logs)."""

    kind: Kind
    name: str
    roles: frozenset[Role]
    names: frozenset[str] = field(default=frozenset())
    via: str = ""
    # The hash of the bearer token it came with ("" for certificates): what an open
    # stream re-checks against the token file, so a revoked token ends it.
    credential: str = field(default="", repr=False, compare=False)

    @property
    def is_admin(self) -> bool:
        return Role.ADMIN in self.roles

    def claims(self, identity: str) -> bool:
        """True when `identity` (an agent id, an EngineConn id) is this caller's own."""
        return bool(identity) and (identity == self.name or identity in self.names)

    def describe(self) -> str:
        if self.kind is Kind.ANONYMOUS:
            return "an anonymous caller" if not self.is_admin else "the dev-mode caller"
        return f"{self.kind.value} {self.name!r}"


ANONYMOUS = Principal(Kind.ANONYMOUS, "", frozenset(), via="none")
# Authentication off (dev mode on loopback): every caller may do everything.
DEV_ADMIN = Principal(Kind.ANONYMOUS, "", frozenset({Role.ADMIN}), via="auth-off")

principal_var: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "principal", default=None
)


def current() -> Principal | None:
    """The principal of the RPC being served (None outside an RPC)."""
    return principal_var.get()


class BadCredentials(Exception):
    """Credentials were presented but prove nothing (counts as a failed attempt)."""


def _text(values: Sequence[bytes] | None) -> list[str]:
    return [v.decode("utf-8", "replace") for v in values or ()]


def from_auth_context(
    auth: Mapping[str, Sequence[bytes]], allow_host_certificates: bool = False
) -> Principal | None:
    """The principal a verified client certificate proves; None without a certificate.

    BadCredentials when the certificate names no usable identity (a server
    certificate, two labelrm URIs, an unknown kind, no labelrm URI at all unless
    `allow_host_certificates`)."""
    common = _text(auth.get("x509_common_name"))
    sans = _text(auth.get("x509_subject_alternative_name"))
    if not common and not sans:
        return None
    uris = [s for s in sans if s.startswith(URI_SCHEME)]
    if len(uris) > 1:
        raise BadCredentials("the certificate names more than one labelrm identity")
    if uris:
        kind_text, _, name = uris[0].removeprefix(URI_SCHEME).partition("/")
        roles = {
            "agent": (Kind.AGENT, Role.AGENT),
            "engineconn": (Kind.ENGINECONN, Role.ENGINECONN),
            "user": (Kind.USER, Role.USER),
        }
        if kind_text not in roles or not name:
            raise BadCredentials(f"certificate identity {uris[0][:80]!r} is not a client identity")
        kind, role = roles[kind_text]
        return Principal(kind, name, frozenset({role}), via="certificate")
    if not allow_host_certificates:
        raise BadCredentials(
            "the certificate has no labelrm:// identity (issue agents theirs with"
            " `rmctl pki`, or set allow_host_certificates to take host certificates as agents)"
        )
    # A host certificate from the operator's CA: an agent, known by its CN or DNS names.
    names = frozenset(n for n in (*common, *sans) if n)
    primary = common[0] if common else sorted(names)[0]
    return Principal(Kind.AGENT, primary, frozenset({Role.AGENT}), names, via="certificate")


def from_token_entry(user: str, roles: Iterable[str], credential: str = "") -> Principal:
    """The principal of a valid bearer token: an agent when it has the agent role.
    `credential`: the token's hash, re-checked by open streams."""
    held = frozenset(Role(r) for r in roles)
    kind = Kind.AGENT if Role.AGENT in held and Role.ADMIN not in held else Kind.USER
    return Principal(kind, user, held, via="token", credential=credential)


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header; "" when the header is
    there but malformed; None when there is none."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer":
            return ""
        return token.strip()
    return None


def peer_host(peer: str) -> str:
    """The address part of a gRPC peer ("ipv4:10.0.0.5:51234" -> "ipv4:10.0.0.5"), the
    unit failed authentications are counted by (a client's ports change, its host not)."""
    if peer.startswith("ipv6:"):
        host, sep, _ = peer.rpartition("]:")
        return host + "]" if sep else peer
    if peer.startswith("ipv4:"):
        return peer.rpartition(":")[0]
    return peer
