"""A small PKI for labelrm, on the `cryptography` package: a throwaway CA and the
certificates of the RM (server), agents, EngineConns and users.

Every certificate names its holder twice: ``CN=<name>`` and the URI SAN
``labelrm://<kind>/<name>``. The RM takes the kind from the URI
(rm_server/security/identity.py), so an EngineConn certificate can never pass for an
agent's even when one CA issues both. Server certificates also carry the DNS names and
IP addresses clients dial.

`rmctl pki` is the command line (``init``, ``issue``, ``dev``) and needs no RM; the RM
itself uses `issue` to give each EngineConn a short-lived certificate
(rm_server/security/ec_certs.py).
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from labelrm_common.cli import tool_main
from labelrm_common.files import replace_file

KINDS = ("server", "agent", "engineconn", "user")
URI_SCHEME = "labelrm://"
# A CN is at most 64 characters (RFC 5280); these also keep file names and URIs plain.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")
# Certificates start a little in the past: clocks of hosts in one cluster drift.
_BACKDATE = timedelta(minutes=5)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    # P-256: small, fast to generate (one per EngineConn launch), supported by gRPC.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def check_name(name: str) -> str:
    """`name` if it can be a certificate identity; ValueError otherwise."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(
            f"{name!r}: an identity is 1-64 of letters, digits and . _ : @ - (not first)"
        )
    return name


def create_ca(
    common_name: str = "labelrm CA", days: float = 3650, now: datetime | None = None
) -> Issued:
    """A self-signed CA that may sign end-entity certificates only (path length 0)."""
    key = _key()
    now = now or datetime.now(UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: Issued,
    kind: str,
    name: str,
    *,
    valid_for: timedelta = timedelta(days=365),
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    now: datetime | None = None,
) -> Issued:
    """A certificate for `name` of `kind` signed by `ca`.

    `now` moves the validity window (tests issue expired certificates with it)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    check_name(name)
    alt: list[x509.GeneralName] = [x509.UniformResourceIdentifier(f"{URI_SCHEME}{kind}/{name}")]
    alt += [x509.DNSName(d) for d in dns]
    alt += [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if kind == "server":
        usage.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    return sign(ca, name, alt, usage, valid_for=valid_for, now=now)


def sign(
    ca: Issued,
    common_name: str,
    alt: Sequence[x509.GeneralName],
    usage: Sequence[x509.ObjectIdentifier],
    *,
    valid_for: timedelta,
    now: datetime | None = None,
) -> Issued:
    """A new key and its certificate signed by `ca`: subject `common_name`, subject
    alternative names `alt`, extended key usage `usage` (none: the extension is left out,
    as some operators' CAs do)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an EC key (as `rmctl pki init` makes)")
    key = _key()
    now = now or datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


# ----- files ---------------------------------------------------------------------------------


def write_private(path: Path, data: bytes) -> None:
    """Write `data` readable by the owner only (0600 whatever the umask); a file that is
    already there keeps its owner, group and mode (a key re-issued for a service user)."""
    replace_file(path, data, 0o600)


def load_ca(directory: Path) -> Issued:
    """The CA `rmctl pki init` wrote into `directory` (ca.crt, ca.key); FileNotFoundError
    saying to run it first when there is none."""
    missing = [n for n in ("ca.crt", "ca.key") if not (directory / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"no CA in {directory} ({' and '.join(missing)} missing): run "
            f"`rmctl pki init --dir {directory}` first"
        )
    return Issued((directory / "ca.crt").read_bytes(), (directory / "ca.key").read_bytes())


def names_of(cert_pem: bytes) -> list[str]:
    """The subject alternative names of a certificate, as `rmctl pki issue` takes them
    (``--dns NAME``, ``--ip ADDRESS``) and its identity URI."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return (
        [str(u) for u in alt.get_values_for_type(x509.UniformResourceIdentifier)]
        + [f"--dns {d}" for d in alt.get_values_for_type(x509.DNSName)]
        + [f"--ip {a}" for a in alt.get_values_for_type(x509.IPAddress)]
    )


def file_stem(kind: str, name: str) -> str:
    """``<kind>-<name>`` with ':' (host:port agent ids) made file-name friendly."""
    return f"{kind}-{name.replace(':', '_')}"


def save(directory: Path, stem: str, issued: Issued) -> tuple[Path, Path]:
    """Write `stem`.crt (world-readable) and `stem`.key (owner only) into `directory`."""
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    replace_file(cert, issued.cert_pem, 0o644)
    write_private(key, issued.key_pem)
    return cert, key


def init_ca(directory: Path, days: float, force: bool = False) -> Path:
    """Create `directory`/ca.crt and ca.key (kept unless `force`)."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "ca.key").exists() and not force:
        raise FileExistsError(f"{directory / 'ca.key'} exists (use --force to replace it)")
    ca = create_ca(days=days)
    save(directory, "ca", ca)
    return directory / "ca.crt"


# ----- command line (`rmctl pki`) ---------------------------------------------------------------


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `pki init|issue|dev` to a parser's subcommands (rmctl's)."""
    pki = commands.add_parser("pki", help="local CA and certificates (no RM needed)")
    sub = pki.add_subparsers(dest="pki_command", required=True, metavar="SUBCOMMAND")
    c = sub.add_parser("init", help="create a CA: DIR/ca.crt, DIR/ca.key")
    c.add_argument("--dir", type=Path, required=True)
    c.add_argument("--days", type=float, default=3650)
    c.add_argument("--force", action="store_true", help="replace an existing CA")
    c = sub.add_parser("issue", help="issue a certificate: DIR/<kind>-<name>.crt and .key")
    c.add_argument("--dir", type=Path, required=True, help="directory with ca.crt and ca.key")
    c.add_argument("kind", choices=KINDS)
    c.add_argument("name", help="the identity: agent id, EngineConn id, user or server name")
    c.add_argument("--dns", action="append", default=[], help="DNS SAN (server), repeatable")
    c.add_argument("--ip", action="append", default=[], help="IP SAN (server), repeatable")
    c.add_argument("--days", type=float, default=365)
    c.add_argument(
        "--force", action="store_true", help="replace an existing certificate of that name"
    )
    c = sub.add_parser(
        "dev", help="CA + server cert (localhost, 127.0.0.1) + agent cert, for dev mode"
    )
    c.add_argument("--dir", type=Path, required=True)
    c.add_argument("--agent-id", default="local-agent")
    c.add_argument("--days", type=float, default=30)
    pki.set_defaults(local_func=run)


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed `pki` command; prints what it wrote."""
    directory: Path = args.dir
    if args.pki_command == "init":
        print(f"wrote {init_ca(directory, args.days, args.force)} and {directory / 'ca.key'}")
        return 0
    if args.pki_command == "issue":
        validity = timedelta(days=args.days)
        ca = load_ca(directory)
        stem = file_stem(args.kind, args.name)
        existing = directory / f"{stem}.crt"
        if existing.exists() and not args.force:
            # Re-issuing without the same --dns / --ip drops those names, and hosts that
            # verify the RM by them stop trusting it: say what the old one names.
            names = ", ".join(names_of(existing.read_bytes())) or "no names"
            raise FileExistsError(
                f"{existing} exists (it names {names}): use --force to replace it, with "
                "the same --dns / --ip if clients still reach it by those"
            )
        issued = issue(ca, args.kind, args.name, valid_for=validity, dns=args.dns, ips=args.ip)
        cert, key = save(directory, stem, issued)
        print(f"wrote {cert} and {key}")
        return 0
    written = dev_pki(directory, args.agent_id, args.days)
    for path in written:
        print(f"wrote {path}")
    return 0


def dev_pki(directory: Path, agent_id: str, days: float) -> list[Path]:
    """A CA, a server certificate for localhost / 127.0.0.1 and one agent certificate;
    an existing CA in `directory` is reused."""
    if not (directory / "ca.key").exists():
        init_ca(directory, days=max(days, 365))
    ca = load_ca(directory)
    validity = timedelta(days=days)
    server = issue(ca, "server", "localhost", valid_for=validity, dns=["localhost"],
                   ips=["127.0.0.1", "::1"])  # fmt: skip
    agent = issue(ca, "agent", agent_id, valid_for=validity)
    return [
        directory / "ca.crt",
        *save(directory, "server", server),
        *save(directory, file_stem("agent", agent_id), agent),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m labelrm_common.pki ...` (same as `rmctl pki ...`)."""
    return tool_main("labelrm-pki", add_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
