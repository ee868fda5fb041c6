"""Development certificates for the ADS link: a local CA, the server and the client identities.

For development only: `stoa-link run` in production refuses a server certificate issued by this CA.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEV_CA_NAME = "STOA development CA"

CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
SERVER_CERT_FILE = "ads-server.pem"
SERVER_KEY_FILE = "ads-server-key.pem"
ENVOY_CERT_FILE = "envoy-client.pem"
ENVOY_KEY_FILE = "envoy-client-key.pem"
AUTHZ_CERT_FILE = "authz-client.pem"
AUTHZ_KEY_FILE = "authz-client-key.pem"
PROC_CERT_FILE = "proc-client.pem"
PROC_KEY_FILE = "proc-client-key.pem"
MCP_CERT_FILE = "mcp-client.pem"
MCP_KEY_FILE = "mcp-client-key.pem"
ALL_FILES = (
    CA_FILE,
    CA_KEY_FILE,
    SERVER_CERT_FILE,
    SERVER_KEY_FILE,
    ENVOY_CERT_FILE,
    ENVOY_KEY_FILE,
    AUTHZ_CERT_FILE,
    AUTHZ_KEY_FILE,
)


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return builder.not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(
        now + dt.timedelta(days=days)
    )


def _role(builder: x509.CertificateBuilder, ca: bool) -> x509.CertificateBuilder:
    """Basic constraints and key usage, both critical: a CA signs certificates and CRLs only, a leaf
    signs its TLS handshakes only."""
    return builder.add_extension(
        x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True
    ).add_extension(
        x509.KeyUsage(
            digital_signature=not ca,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=ca,
            crl_sign=ca,
            encipher_only=False,
            decipher_only=False,
        ),
        critical=True,
    )


def make_ca() -> Issued:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, DEV_CA_NAME)])
    builder = _role(
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number()),
        ca=True,
    ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    cert = _validity(builder, 3650).sign(key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _leaf(
    ca: Issued,
    subject: x509.Name,
    san: x509.SubjectAlternativeName,
    san_critical: bool,
    usage: x509.ObjectIdentifier,
) -> Issued:
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key")
    key = _key()
    builder = (
        _role(
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number()),
            ca=False,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(san, critical=san_critical)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    cert = _validity(builder, 825).sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_server(ca: Issued) -> Issued:
    san = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
    )
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    return _leaf(ca, subject, san, False, ExtendedKeyUsageOID.SERVER_AUTH)


def issue_client(ca: Issued, uri_san: str) -> Issued:
    """A client identity whose only name is one URI SAN: empty subject, so the SAN is critical (RFC 5280)."""
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri_san)])
    return _leaf(ca, x509.Name([]), san, True, ExtendedKeyUsageOID.CLIENT_AUTH)


def _write(path: Path, data: bytes, private: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def write_dev_certs(
    out: Path, envoy_san: str, authz_san: str, force: bool = False, proc_san: str = "", mcp_san: str = ""
) -> bool:
    """Write the development CA and certificates into `out`. Returns False when a complete set was kept.

    A complete existing set is kept (so `make run` twice keeps the identities Envoy was started with);
    a partial one is an error unless `force`. The processing service's certificate (`proc_san`) is
    issued from the set's CA when the rest is already there; so is the MCP module's (`mcp_san`).
    """
    written = _write_main_set(out, envoy_san, authz_san, force)
    for san, cert_file, key_file in (
        (proc_san, PROC_CERT_FILE, PROC_KEY_FILE),
        (mcp_san, MCP_CERT_FILE, MCP_KEY_FILE),
    ):
        if san and (force or written or not (out / cert_file).exists()):
            issued = issue_client(load_ca(out), san)
            _write(out / key_file, issued.key_pem, private=True)
            _write(out / cert_file, issued.cert_pem, private=False)
            written = True
    return written


def _write_main_set(out: Path, envoy_san: str, authz_san: str, force: bool) -> bool:
    out.mkdir(parents=True, exist_ok=True)
    expected = ALL_FILES if authz_san else ALL_FILES[:6]
    present = [name for name in expected if (out / name).exists()]
    if present and not force:
        if len(present) == len(expected):
            return False
        raise FileExistsError(
            f"{out} holds only part of a certificate set ({', '.join(present)}); use --force to replace it"
        )
    ca = make_ca()
    files: list[tuple[str, str, Issued]] = [
        (CA_FILE, CA_KEY_FILE, ca),
        (SERVER_CERT_FILE, SERVER_KEY_FILE, issue_server(ca)),
        (ENVOY_CERT_FILE, ENVOY_KEY_FILE, issue_client(ca, envoy_san)),
    ]
    if authz_san:
        files.append((AUTHZ_CERT_FILE, AUTHZ_KEY_FILE, issue_client(ca, authz_san)))
    for cert_name, key_name, issued in files:
        _write(out / key_name, issued.key_pem, private=True)
        _write(out / cert_name, issued.cert_pem, private=False)
    return True


def load_ca(tls_dir: Path) -> Issued:
    return Issued((tls_dir / CA_FILE).read_bytes(), (tls_dir / CA_KEY_FILE).read_bytes())


def issued_by_dev_ca(cert_pem: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    return any(attr.value == DEV_CA_NAME for attr in names)
