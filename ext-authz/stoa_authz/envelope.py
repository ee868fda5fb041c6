"""The signed identity envelope for upstreams: `x-stoa-identity`, a compact JWS (EdDSA, Ed25519)
valid for 60 s, whose public key is published at `/.well-known/jwks.json`."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc.jwk import OKPKey
from stoa_translate import jwks as keysets

LIFETIME_S = 60


def write_ephemeral_key(directory: str | None = None) -> Path:
    """A fresh Ed25519 key in a 0600 file (shared by worker processes; the caller deletes it)."""
    pem = keysets.new_signing_key()
    fd, name = tempfile.mkstemp(prefix="stoa-authz-signing-", suffix=".pem", dir=directory)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return Path(name)


class Envelope:
    """Mints the envelope per request (the request id is in it). The protected header is fixed, so
    its base64url segment is built once; each request serialises its claims onto a prefix prepared
    per decision (`claims_prefix`) and signs with Ed25519 directly: a compact JWS, RFC 7515/8037."""

    def __init__(self, key: OKPKey, issuer: str, clock: Callable[[], float] = time.time) -> None:
        self._signer: Ed25519PrivateKey = key.private_key  # type: ignore[assignment]
        self._issuer = issuer
        self._clock = clock
        self.kid = key.thumbprint()
        self._header_segment = keysets.header_segment(self.kid, "JWT")
        self.jwks = json.dumps({"keys": [keysets.signing_jwk(key)]}).encode()

    def claims_prefix(
        self,
        tenant: str,
        api: str,
        subject: str,
        scopes: Iterable[str],
        consumer: str | None = None,
        subscription: str | None = None,
    ) -> str:
        """The claims that stay the same for every request of one decision, as an open JSON object."""
        fixed: dict[str, object] = {
            "iss": self._issuer,
            "tenant": tenant,
            "api": api,
            "sub": subject,
            "scopes": sorted(scopes),
        }
        if consumer is not None:
            fixed["consumer"] = consumer
        if subscription is not None:
            fixed["subscription"] = subscription
        return json.dumps(fixed, separators=(",", ":"))[:-1] + ","

    def mint(self, claims_prefix: str, request_id: str) -> str:
        now = int(self._clock())
        payload = (
            f'{claims_prefix}"request_id":{json.dumps(request_id)},"iat":{now},"exp":{now + LIFETIME_S}}}'
        )
        return keysets.sign_compact(self._signer, self._header_segment, payload.encode())
