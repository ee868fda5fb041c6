"""The signed identity envelope for upstreams: `x-stoa-identity`, a compact JWS (EdDSA, Ed25519)
valid for 60 s, whose public key is published at `/.well-known/jwks.json`."""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc import jws
from joserfc.errors import SecurityWarning
from joserfc.jwk import OKPKey

LIFETIME_S = 60
# "EdDSA" is what upstream verifiers understand today; joserfc warns it is superseded by RFC 9864.
warnings.filterwarnings("ignore", message="EdDSA is deprecated", category=SecurityWarning)


class SigningKeyError(Exception):
    pass


def load_signing_key(path: Path) -> OKPKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"cannot read signing key {path}: {exc.strerror}") from exc
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"signing key {path} is not an unencrypted PEM private key") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyError(f"signing key {path} is not an Ed25519 key")
    return OKPKey.import_key(data)


def write_ephemeral_key(directory: str | None = None) -> Path:
    """A fresh Ed25519 key in a 0600 file (shared by worker processes; the caller deletes it)."""
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd, name = tempfile.mkstemp(prefix="stoa-authz-signing-", suffix=".pem", dir=directory)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return Path(name)


class Envelope:
    def __init__(self, key: OKPKey, issuer: str) -> None:
        self._key = key
        self._issuer = issuer
        self.kid = key.thumbprint()
        self._header = {"alg": "EdDSA", "typ": "JWT", "kid": self.kid}
        public = key.as_dict(private=False)
        public.update({"kid": self.kid, "alg": "EdDSA", "use": "sig"})
        self.jwks = json.dumps({"keys": [public]}).encode()

    def mint(self, tenant: str, api: str, subject: str, scopes: Iterable[str], request_id: str) -> str:
        now = int(time.time())
        payload = {
            "iss": self._issuer,
            "tenant": tenant,
            "api": api,
            "sub": subject,
            "scopes": sorted(scopes),
            "request_id": request_id,
            "iat": now,
            "exp": now + LIFETIME_S,
        }
        return jws.serialize_compact(
            self._header, json.dumps(payload, separators=(",", ":")), self._key, algorithms=["EdDSA"]
        )
