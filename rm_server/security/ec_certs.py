"""EngineConn certificates: when the RM has an issuing CA, every launch carries a fresh
short-lived certificate for ``CN=<engine_conn_id>`` (URI SAN
``labelrm://engineconn/<engine_conn_id>``) with its key, and the CA bundle that
verifies the RM, as material files.

The agent writes material files into the EngineConn's work directory owned by the
EngineConn's user, mode 0640 (ecm_agent/launch.py), and the launch script starts in
that directory, so the environment names them by relative path. The EngineConn then
dials the RM with TLS and this certificate (engineconn/runtime.py), and the RM's
policy lets it report the state of that one EngineConn only.

The key travels in the launch command (database row, command stream to the agent):
both are inside the RM's trust boundary, as the agent is root on its host anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from labelrm_common import pki

CA_FILE = "labelrm-rm-ca.crt"
CERT_FILE = "labelrm-engineconn.crt"
KEY_FILE = "labelrm-engineconn.key"

Material = tuple[str, bytes, bool]  # (file name, content, executable)


@dataclass(frozen=True)
class EcCredentials:
    """What one launch gets: material files and the environment naming them."""

    files: tuple[Material, ...]
    environment: Mapping[str, str]


class EngineConnIssuer:
    """Issues EngineConn certificates from the RM's issuing CA."""

    def __init__(self, ca: pki.Issued, trust_pem: bytes, lifetime: timedelta) -> None:
        self.ca = ca
        self.trust_pem = trust_pem
        self.lifetime = lifetime

    def issue(self, ec_id: str) -> EcCredentials:
        issued = pki.issue(self.ca, "engineconn", ec_id, valid_for=self.lifetime)
        return EcCredentials(
            files=(
                (CA_FILE, self.trust_pem, False),
                (CERT_FILE, issued.cert_pem, False),
                (KEY_FILE, issued.key_pem, False),
            ),
            environment={
                "LABELRM_TLS_CA": CA_FILE,
                "LABELRM_TLS_CERT": CERT_FILE,
                "LABELRM_TLS_KEY": KEY_FILE,
            },
        )
