"""From `Settings` to a secured RM: refuses unsafe set-ups before anything starts,
opens the listeners with the right credentials, and builds the auth interceptor, the
limits and the EngineConn certificate issuer.

Listeners (gRPC's Python API can ask for client certificates only as "required" or
"not at all", so the two kinds of callers get a listener each when both are used):

- ``listen``: users and operators, with bearer tokens; TLS when ``tls_cert`` is set.
  With ``tls_client_ca`` and no ``agent_listen``, it requires client certificates from
  everyone (agents, EngineConns and users alike).
- ``agent_listen`` (optional): agents and EngineConns; TLS with a client certificate
  required and verified against ``tls_client_ca`` plus the issuing CA (with
  authentication off, on loopback, plaintext).

Authentication is on as soon as a token file or TLS is configured. Without either it
is OFF, every caller is an admin, and every listener must be on loopback.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import grpc

from labelrm_common import pki
from labelrm_common.roles import Role
from labelrm_common.tokens import TokenFileError
from rm_server.config import Settings
from rm_server.domain.labels import parse_rules
from rm_server.security import policy
from rm_server.security.ec_certs import EcCredentials, EngineConnIssuer
from rm_server.security.identity import bearer_token
from rm_server.security.interceptor import AuthInterceptor
from rm_server.security.limits import Limits, LimitSettings
from rm_server.security.tokens import TokenFile

log = logging.getLogger(__name__)


class SecurityConfigError(ValueError):
    """The settings would run the RM unsafely (or cannot work); the RM does not start."""


def split_host(address: str) -> str:
    host, sep, _ = address.rpartition(":")
    if not sep:
        raise SecurityConfigError(f"{address!r} is not HOST:PORT")
    return host.strip("[]")


def is_loopback(address: str) -> bool:
    """True for HOST:PORT on a loopback address; a name other than localhost is not
    resolved (it may point anywhere) and counts as non-loopback."""
    host = split_host(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read {what} {path}: {exc}") from exc


@dataclass
class _CertFiles:
    """Server certificate files, re-read when they change (rotation without restart)."""

    cert: str
    key: str
    roots: tuple[str, ...]
    extra_roots: bytes = b""
    _stamp: tuple[tuple[int, int], ...] = field(default=())

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path in (self.cert, self.key, *self.roots):
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0))
        return tuple(out)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        self._stamp = self._stamps()
        roots = b"".join(_read(p, "CA bundle") for p in self.roots) + self.extra_roots
        pair = [(_read(self.key, "TLS key"), _read(self.cert, "TLS certificate"))]
        return grpc.ssl_server_certificate_configuration(pair, roots or None)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each handshake: a new configuration when files changed."""
        if self._stamps() == self._stamp:
            return None
        try:
            config = self.configuration()
        except (SecurityConfigError, ValueError) as exc:
            log.error("TLS files changed but cannot be loaded, keeping the old ones: %s", exc)
            return None
        log.info("TLS certificate files changed: reloaded")
        return config

    def credentials(self, require_client_cert: bool) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.configuration(), self.fetch, require_client_cert
        )


@dataclass
class Security:
    """The security set-up of one RM process."""

    settings: Settings
    auth_enabled: bool
    tokens: TokenFile | None
    limits: Limits
    issuer: EngineConnIssuer | None
    _main_certs: _CertFiles | None = None
    _mtls_certs: _CertFiles | None = None
    _main_requires_cert: bool = False

    def interceptor(self, owners: policy.Owners) -> AuthInterceptor:
        """The authentication and policy checks of every call; `owners` answers the
        policy's ownership questions (rm_server/app/owners.py reads them from the
        database)."""
        proxies = {u.strip() for u in self.settings.proxy_users.split(",") if u.strip()}
        return AuthInterceptor(
            enabled=self.auth_enabled,
            tokens=self.tokens,
            owners=owners,
            limits=self.limits,
            proxy_users=proxies,
            allow_host_certificates=self.settings.allow_host_certificates,
            rules=parse_rules(self.settings.label_rules),
        )

    @property
    def ec_credentials(self) -> Callable[[str], EcCredentials] | None:
        return self.issuer.issue if self.issuer is not None else None

    def add_user_port(self, server: grpc.aio.Server) -> int:
        """Open `listen` on `server`; returns its port."""
        st = self.settings
        if self._main_certs is None:
            port = server.add_insecure_port(st.listen)
        else:
            creds = self._main_certs.credentials(self._main_requires_cert)
            port = server.add_secure_port(st.listen, creds)
        if port == 0:
            raise OSError(f"cannot listen on {st.listen}")
        return int(port)

    def add_agent_port(self, server: grpc.aio.Server) -> int:
        """Open `agent_listen` on `server` (mutual TLS; plaintext with authentication
        off, on loopback); returns its port."""
        st = self.settings
        assert st.agent_listen
        if self._mtls_certs is None:
            assert not self.auth_enabled
            port = server.add_insecure_port(st.agent_listen)
        else:
            port = server.add_secure_port(st.agent_listen, self._mtls_certs.credentials(True))
        if port == 0:
            raise OSError(f"cannot listen on {st.agent_listen}")
        return int(port)

    def metrics_guard(
        self,
    ) -> tuple[ssl.SSLContext | None, Callable[[str | None], bool] | None]:
        """(TLS, authorization) of the metrics endpoint. On loopback it is served as is
        (like the gRPC listeners in dev mode); elsewhere it obeys the listeners' rule:
        HTTPS with the RM's certificate when TLS is on, and a bearer token with the
        admin role on every scrape (`build_security` refused the rest)."""
        st = self.settings
        if not st.metrics_listen or is_loopback(st.metrics_listen):
            return None, None
        context = None
        if st.tls_cert:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(st.tls_cert, st.tls_key)
        tokens = self.tokens

        def authorize(header: str | None) -> bool:
            token = bearer_token([("authorization", header)] if header is not None else [])
            found = tokens.find(token) if tokens is not None and token else None
            return found is not None and Role.ADMIN in found[1].roles

        return context, authorize

    def describe(self, agent_port: int = 0) -> str:
        if not self.auth_enabled:
            text = "authentication OFF (dev mode, loopback only): every caller is an admin"
            if self.settings.agent_listen:
                text += f"; agents and EngineConns on {self._agent_where(agent_port)} (plaintext)"
            return text
        parts = ["authentication on"]
        parts.append(f"{len(self.tokens)} tokens" if self.tokens is not None else "no tokens")
        if self._main_certs is not None:
            parts.append("TLS" + (" + client certificates" if self._main_requires_cert else ""))
        else:
            parts.append("PLAINTEXT (insecure)")
        if self.settings.agent_listen:
            parts.append(f"agents and EngineConns on {self._agent_where(agent_port)} (mutual TLS)")
        parts.append("EngineConn certificates " + ("issued" if self.issuer else "NOT issued"))
        return ", ".join(parts)

    def _agent_where(self, agent_port: int) -> str:
        where = self.settings.agent_listen
        return f"{where.rpartition(':')[0]}:{agent_port}" if agent_port else where


def build_security(st: Settings) -> Security:
    """Validate the security settings and prepare everything; SecurityConfigError when
    the set-up is unsafe or incomplete (see docs/security.md)."""
    if bool(st.tls_cert) != bool(st.tls_key):
        raise SecurityConfigError("tls_cert and tls_key go together")
    if bool(st.tls_issuer_cert) != bool(st.tls_issuer_key):
        raise SecurityConfigError("tls_issuer_cert and tls_issuer_key go together")
    tls = bool(st.tls_cert)
    auth = bool(st.token_file or tls)
    # With authentication off (loopback only, below), agent_listen is a plain second
    # listener: agents on a listener of their own, with its own receive limit, as in
    # production, without certificates.
    plain_agents = bool(st.agent_listen) and not auth
    wants_client_certs = bool(
        st.tls_client_ca or (st.agent_listen and not plain_agents) or st.tls_issuer_cert
    )
    if wants_client_certs and not tls:
        raise SecurityConfigError(
            "client certificates (tls_client_ca, agent_listen, tls_issuer_*) need TLS:"
            " set tls_cert and tls_key"
        )
    if st.tls_issuer_cert and not (st.agent_listen or st.tls_client_ca):
        raise SecurityConfigError(
            "tls_issuer_* issues EngineConn certificates, but no listener asks for client"
            " certificates: set agent_listen (or tls_client_ca)"
        )
    if st.agent_listen and not plain_agents and not (st.tls_client_ca or st.tls_issuer_cert):
        raise SecurityConfigError("agent_listen needs tls_client_ca (and/or tls_issuer_*)")
    listeners = [a for a in (st.listen, st.agent_listen, st.metrics_listen, st.console_listen) if a]
    exposed = [a for a in listeners if not is_loopback(a)]
    if exposed and not auth:
        raise SecurityConfigError(
            f"refusing to serve {', '.join(exposed)} with authentication off: configure"
            " token_file and/or TLS (dev mode without them is for loopback only)"
        )
    if not is_loopback(st.listen) and not tls and not st.insecure:
        raise SecurityConfigError(
            f"refusing to listen on non-loopback {st.listen} without TLS: set tls_cert and"
            " tls_key, or pass --insecure (tokens then cross the network in clear text)"
        )
    if st.metrics_listen and not is_loopback(st.metrics_listen):
        if not tls and not st.insecure:
            raise SecurityConfigError(
                f"refusing to serve metrics on non-loopback {st.metrics_listen} without TLS:"
                " set tls_cert and tls_key, or pass --insecure"
            )
        if not st.token_file:
            raise SecurityConfigError(
                f"metrics on non-loopback {st.metrics_listen} need an admin bearer token:"
                " set token_file"
            )
    if st.console_listen and not is_loopback(st.console_listen):
        # The web console signs in with tokens, served over HTTPS with the RM's certificate.
        if not tls and not st.insecure:
            raise SecurityConfigError(
                f"refusing to serve the console on non-loopback {st.console_listen} without"
                " TLS: set tls_cert and tls_key, or pass --insecure"
            )
        if not st.token_file:
            raise SecurityConfigError(
                f"the console on non-loopback {st.console_listen} signs in with tokens:"
                " set token_file"
            )
    tokens = None
    if st.token_file:
        try:
            tokens = TokenFile(Path(st.token_file))
        except TokenFileError as exc:
            raise SecurityConfigError(str(exc)) from exc
    issuer = None
    issuer_pem = b""
    if st.tls_issuer_cert:
        ca = pki.Issued(
            _read(st.tls_issuer_cert, "issuer certificate"), _read(st.tls_issuer_key, "issuer key")
        )
        issuer_pem = ca.cert_pem
        trust = _read(st.tls_server_ca, "server CA") if st.tls_server_ca else ca.cert_pem
        issuer = EngineConnIssuer(ca, trust, timedelta(hours=st.ec_cert_hours))
        try:
            issuer.issue("ec-selftest")  # a key or CA that cannot sign fails now, not per launch
        except ValueError as exc:
            raise SecurityConfigError(f"the issuing CA cannot issue: {exc}") from exc
    roots = tuple(p for p in (st.tls_client_ca,) if p)
    main = mtls = None
    if tls:
        main = _CertFiles(st.tls_cert, st.tls_key, roots if not st.agent_listen else ())
        main.extra_roots = issuer_pem if not st.agent_listen else b""
        if st.agent_listen:
            mtls = _CertFiles(st.tls_cert, st.tls_key, roots, issuer_pem)
    security = Security(
        settings=st,
        auth_enabled=auth,
        tokens=tokens,
        limits=Limits(
            LimitSettings(
                apply_rate=st.apply_rate,
                apply_burst=st.apply_burst,
                call_rate=st.call_rate,
                call_burst=st.call_burst,
                max_watch_streams=st.max_watch_streams,
                max_waiting_applies=st.max_waiting_applies,
                auth_failure_limit=st.auth_failure_limit,
                auth_failure_window=st.auth_failure_window,
            )
        ),
        issuer=issuer,
        _main_certs=main,
        _mtls_certs=mtls,
        _main_requires_cert=bool(tls and st.tls_client_ca and not st.agent_listen),
    )
    if main is not None:
        main.configuration()  # unreadable files fail the start, not the first handshake
    if auth and issuer is None:
        log.warning(
            "no issuing CA (tls_issuer_cert/tls_issuer_key): EngineConns cannot authenticate"
            " and will not become ready"
        )
    return security
