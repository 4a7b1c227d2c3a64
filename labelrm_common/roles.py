"""The roles a caller may hold, shared by the RM (which checks them, see
rm_server/security/policy.py) and `rmctl token` (which writes them into the token file)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TOKEN_ROLES", "Role"]


class Role(StrEnum):
    """What a principal may do; policy.py says which calls each role may make."""

    USER = "user"
    ADMIN = "admin"
    AGENT = "agent"
    ENGINECONN = "engineconn"  # only ever from an EngineConn certificate


# The roles a bearer token may carry: the EngineConn role comes from certificates only.
TOKEN_ROLES = frozenset({Role.USER, Role.ADMIN, Role.AGENT})
