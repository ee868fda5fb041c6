"""Signing the tool permissions: the keys, the compact JWS, and the keeper that re-signs in time.

Keys are the Ed25519 private keys (PEM) in `STOA_CP_MCP_SIGNING_KEY_DIR`; the one whose file name
sorts last signs, and `kid` is its RFC 7638 thumbprint. The directory is read again on every round,
so a rotation is: put the new key in with a later name (the sites already pinning its public key, see
`GET /v1/tool-permissions/keys`), and the keeper re-signs every gateway with it; the artifacts signed
with the old key stay valid until they expire, which is the overlap. Remove the old file after that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from stoa_translate import jwks as keysets
from stoa_translate.jwks import SigningKeyError

from stoa_cp.store import tool_permissions
from stoa_cp.store.database import Database

log = logging.getLogger("stoa_cp.permissions")

MAX_LIFETIME_S = 900
TYP = "stoa-tool-permissions+jwt"


def _load(path: Path) -> tuple[str, Ed25519PrivateKey, dict[str, Any]]:
    key = keysets.read_signing_key(path)
    public = keysets.signing_jwk(key)
    return public["kid"], key.private_key, public  # type: ignore[return-value]


def public_jwk(path: Path) -> dict[str, Any]:
    """The public JWK (with its kid) of the signing key in `path`: what a site pins."""
    return _load(path)[2]


def write_key(path: Path) -> str:
    """A new Ed25519 signing key in a 0600 file; its kid."""
    pem = keysets.new_signing_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_bytes(pem)
    return _load(path)[0]


class Signer:
    def __init__(self, key_dir: Path, issuer: str, lifetime_s: int) -> None:
        if not 0 < lifetime_s <= MAX_LIFETIME_S:
            raise ValueError(f"the tool permissions' lifetime must be 1..{MAX_LIFETIME_S} s")
        self.key_dir = key_dir
        self.issuer = issuer
        self.lifetime_s = lifetime_s
        self._cache: dict[tuple[str, int], tuple[str, Ed25519PrivateKey, dict[str, Any]]] = {}
        self.keys()  # a missing or unreadable key refuses start-up

    def keys(self) -> list[tuple[str, Ed25519PrivateKey, dict[str, Any]]]:
        """Every key of the directory, by file name; the last one signs."""
        files = sorted(p for p in self.key_dir.glob("*.pem") if p.is_file())
        if not files:
            raise SigningKeyError(f"no signing key (*.pem) in {self.key_dir}")
        loaded = []
        for path in files:
            stamp = (str(path), path.stat().st_mtime_ns)
            if stamp not in self._cache:
                self._cache[stamp] = _load(path)
            loaded.append(self._cache[stamp])
        return loaded

    def active_kid(self) -> str:
        return self.keys()[-1][0]

    def jwks(self) -> dict[str, Any]:
        return {"keys": [public for _, _, public in self.keys()]}

    def sign(self, payload: dict[str, Any]) -> tuple[str, str]:
        kid, key, _ = self.keys()[-1]
        body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        return kid, keysets.sign_compact(key, keysets.header_segment(kid, TYP), body)


async def keep_forever(
    db: Database, signer: Signer, wake: Callable[[], asyncio.Event], interval_s: float
) -> None:
    """Re-sign every gateway's permissions that need it: every `interval_s`, and at once when a
    gateway changes (a deployment adds or removes a tenant's MCP route)."""
    while True:
        started = time.monotonic()
        try:
            async with db.connection() as conn:
                gateway_ids = await tool_permissions.gateways_with_mcp(conn)
            for gateway_id in gateway_ids:
                async with db.transaction() as conn:
                    await tool_permissions.resign(conn, [gateway_id], signer)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Fail closed at the site: without a fresh artifact the module stops allowing at expiry.
            log.exception("re-signing the tool permissions failed; trying again")
        event = wake()
        remaining = max(0.0, interval_s - (time.monotonic() - started))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), remaining)
