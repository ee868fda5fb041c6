"""Who an ADS client is: the server's TLS material and the client's verified URI SAN.

Mutual TLS is checked in grpc-core (a chain from another CA never reaches Python); what is left here
is what grpcio cannot enforce: TLS 1.3 (grpcio has no minimum-version setting) and exactly one URI
SAN, the identity. The node id in discovery requests is never an authentication input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from stoa_link import certs


@dataclass(frozen=True)
class TlsMaterial:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def server_from_dir(cls, tls_dir: Path) -> TlsMaterial:
        paths = [tls_dir / certs.CA_FILE, tls_dir / certs.SERVER_CERT_FILE, tls_dir / certs.SERVER_KEY_FILE]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"ADS TLS files missing: {', '.join(missing)} (create them with `stoa-link certs --out DIR`)"
            )
        return cls(*(p.read_bytes() for p in paths))

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials that require a client certificate chaining to our CA."""
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=True
        )


def peer_identity(context: grpc.aio.ServicerContext) -> tuple[str | None, str]:
    """The client's single URI SAN from its verified chain, or None with the reason it has none."""
    auth = context.auth_context()
    tls_version = [v.decode() for v in auth.get("ssl_tls_version", [])]
    if tls_version != ["TLSv1.3"]:
        return None, f"TLS 1.3 required (client negotiated {tls_version or 'no TLS'})"
    sans = [v.decode() for v in auth.get("x509_subject_alternative_name", [])]
    uris = [v.decode() for v in auth.get("peer_uri", [])] or [s for s in sans if "://" in s]
    if len(uris) != 1:
        return None, f"client certificate must carry exactly one URI SAN (found {len(uris)})"
    return uris[0], ""
