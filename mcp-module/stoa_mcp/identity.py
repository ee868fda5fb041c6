"""The caller, only from the verified `x-stoa-identity` envelope the authorization service signed for
this request (EdDSA, its keys from its published JWKS, fetched again at an unknown `kid` at most every
few seconds). Nothing else the request carries names the caller.

The consumer is the envelope's `consumer` when the authorization service resolved one, else its
`sub` (the token's subject): grants name consumers by that value.

An envelope is taken once: the module forwards it to the tool's backing API (the caller's identity
there), and that API must not be able to present it to the module again, within its lifetime, to call
other tools as the caller. The authorization service mints one per request, so a request through
Envoy always brings a new one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from stoa_mcp.permissions import Caller

log = logging.getLogger("stoa_mcp.identity")
REFETCH_MIN_INTERVAL_S = 5.0
# How many envelopes taken are remembered until they expire (`EnvelopeVerifier.taken`); past it the
# oldest are forgotten first: a replay would have to wait behind this many newer calls.
MAX_TAKEN = 500_000


class NotIdentified(Exception):
    """No usable envelope: the request is refused (the message is for the log, never the client)."""


def _b64(segment: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise NotIdentified("envelope is not base64url") from None


@dataclass
class EnvelopeVerifier:
    jwks_url: str
    issuer: str
    # The module's HTTP client (the keys are fetched through it).
    http: aiohttp.ClientSession
    skew_s: int = 30
    clock: Callable[[], float] = time.time
    _keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)
    _fetched_at: float = float("-inf")
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The signatures of the envelopes taken, with the time each stops being valid (in taking order,
    # which is their expiry order: every envelope lives as long).
    taken: OrderedDict[bytes, float] = field(default_factory=OrderedDict)

    @property
    def has_keys(self) -> bool:
        return bool(self._keys)

    async def refresh(self) -> None:
        """Fetch the authorization service's keys (bounded; the keys held stay on failure)."""
        async with self._lock:
            if time.monotonic() - self._fetched_at < REFETCH_MIN_INTERVAL_S and self._keys:
                return
            self._fetched_at = time.monotonic()
            try:
                async with self.http.get(
                    self.jwks_url, timeout=aiohttp.ClientTimeout(total=2.0), allow_redirects=False
                ) as response:
                    response.raise_for_status()
                    document = await response.json(content_type=None)
                keys = {}
                for jwk in document.get("keys", []):
                    if (
                        jwk.get("kty") == "OKP"
                        and jwk.get("crv") == "Ed25519"
                        and isinstance(jwk.get("kid"), str)
                    ):
                        keys[jwk["kid"]] = Ed25519PublicKey.from_public_bytes(_b64(jwk["x"]))
            except (aiohttp.ClientError, TimeoutError, ValueError, NotIdentified, AttributeError) as exc:
                log.warning("envelope keys not fetched", extra={"url": self.jwks_url, "error": repr(exc)})
                return
            self._keys = keys

    async def caller(self, envelope: str | None) -> Caller:
        if not envelope:
            raise NotIdentified("no identity envelope")
        parts = envelope.split(".")
        if len(parts) != 3:
            raise NotIdentified("envelope is not a compact JWS")
        try:
            header = json.loads(_b64(parts[0]))
            claims = json.loads(_b64(parts[1]))
        except ValueError:
            raise NotIdentified("envelope is unreadable") from None
        if not isinstance(header, dict) or not isinstance(claims, dict) or header.get("alg") != "EdDSA":
            raise NotIdentified("envelope is not an EdDSA JWS")
        kid = header.get("kid")
        if kid not in self._keys:
            await self.refresh()
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise NotIdentified("envelope signed by an unknown key")
        signature = _b64(parts[2])
        try:
            key.verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"))
        except InvalidSignature:
            raise NotIdentified("envelope signature does not verify") from None
        now = self.clock()
        exp = claims.get("exp")
        if claims.get("iss") != self.issuer or type(exp) is not int or exp + self.skew_s <= now:
            raise NotIdentified("envelope expired or of another issuer")
        # By the signature's bytes: its text has other spellings (padding, alphabet, unused bits).
        self._take(signature, exp + self.skew_s, now)
        tenant, api, subject = claims.get("tenant"), claims.get("api"), claims.get("sub")
        scopes = claims.get("scopes", [])
        if not all(isinstance(v, str) and v for v in (tenant, api, subject)) or not isinstance(scopes, list):
            raise NotIdentified("envelope lacks tenant, api or sub")
        consumer = claims.get("consumer")
        return Caller(
            tenant_id=str(tenant),
            api_id=str(api),
            consumer=consumer if isinstance(consumer, str) and consumer else str(subject),
            scopes=frozenset(s for s in scopes if isinstance(s, str)),
        )

    def _take(self, signature: bytes, valid_until: float, now: float) -> None:
        """Remember an envelope as taken; NotIdentified if it was taken before."""
        taken = self.taken
        while taken and (len(taken) >= MAX_TAKEN or next(iter(taken.values())) <= now):
            taken.popitem(last=False)
        if signature in taken:
            raise NotIdentified("envelope presented again")
        taken[signature] = valid_until
