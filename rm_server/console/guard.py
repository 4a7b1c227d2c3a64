"""What a web page the console's user visits must not make their browser do to the
console, whatever the authentication mode (in dev mode there is none: every request
is an admin's):

- **DNS rebinding.** A page at ``http://rebind.attacker.example:7180/`` whose name
  the attacker then points at 127.0.0.1 is, to the browser, the same origin as the
  console, and reads every answer. Only requests whose ``Host`` names an address the
  console was bound to (``localhost`` for a loopback one; any IP address for a
  wildcard one, as rebinding needs a name; the names in ``console_hosts``) are
  served, others get 421 Misdirected Request.
- **Cross-site requests.** A form on another site can POST to the console with the
  browser's credentials (none are needed in dev mode). Every state change needs an
  ``Origin`` naming the console itself (what the ``Host`` names) and the header
  ``X-Labelrm-Console``, which no form can send and a cross-origin script can only
  send after a CORS preflight the console never answers: 403 otherwise.

See the OWASP Cross-Site Request Forgery Prevention Cheat Sheet (verifying the origin
with standard headers, custom request headers) and RFC 9110 (Host, 421).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

CONSOLE_HEADER = "X-Labelrm-Console"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class Refused(Exception):
    """A request the guard refuses: `status` and what to say."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def host_of(netloc: str) -> str:
    """The host part of ``host[:port]`` (``[v6][:port]`` too), lower-case, without a
    trailing dot; "" when there is none."""
    text = netloc.strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else ""
    name, colon, port = text.rpartition(":")
    if colon and port.isdigit():
        text = name
    return text.rstrip(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostGuard:
    """The hosts a console bound to `bound` (the host of its listen address) answers to."""

    bound: str
    names: frozenset[str]  # console_hosts

    @classmethod
    def of(cls, listen_host: str, extra: Iterable[str] = ()) -> HostGuard:
        """The guard of a console listening on `listen_host` (no port; an IPv6 address
        with or without brackets) that also answers to the names `extra`."""
        names = frozenset(host_of(n) for n in extra if n.strip())
        return cls(listen_host.strip().strip("[]").lower().rstrip("."), names)

    def allows(self, host: str) -> bool:
        """Whether a request whose Host header names `host` (host part only) is meant
        for this console."""
        if not host:
            return False
        if host in self.names or host == self.bound:
            return True
        if self.bound in _WILDCARDS:
            return host == "localhost" or _is_ip(host)
        if host == "localhost":
            return _is_ip(self.bound) and ipaddress.ip_address(self.bound).is_loopback
        return False

    def check(self, method: str, headers: Mapping[str, str]) -> None:
        """Raise Refused unless the request may be served (module doc)."""
        host_header = headers.get("Host", "")
        if not self.allows(host_of(host_header)):
            raise Refused(
                421,
                f"this console does not answer to Host {host_of(host_header)[:100]!r}: open it"
                " at the address it listens on (or list the name in console_hosts)",
            )
        if method.upper() in SAFE_METHODS:
            return
        origin = headers.get("Origin", "")
        netloc = urlsplit(origin).netloc.lower() if origin and origin != "null" else ""
        if not netloc or netloc != host_header.strip().lower():
            raise Refused(
                403,
                f"a change needs the Origin of this console, not {origin[:100]!r}"
                " (cross-site requests are refused)",
            )
        if not headers.get(CONSOLE_HEADER):
            raise Refused(
                403, f"a change needs the {CONSOLE_HEADER} header (the console's page sends it)"
            )
