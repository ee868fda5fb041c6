"""Who is calling the CP API: a bearer token becomes a Principal (subject, role, tenant) or is refused.

Two kinds of token are accepted:
- a JWT from an issuer the platform trusts (`STOA_CP_OIDC_ISSUERS`): asymmetric signature checked
  against the issuer's JWKS (found through OIDC discovery, cached, re-fetched at most every
  REFRESH_INTERVAL_S when a token names an unknown `kid`), `iss`, `aud` (`STOA_CP_OIDC_AUDIENCE`) and
  `exp` required; the roles come from the roles claim, the tenant from the tenant claim;
- a static admin token (`STOA_CP_ADMIN_TOKENS`, bootstrap only, never in production): a platform admin.

No token and no claim value is ever logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from joserfc import jwt
from joserfc.errors import ExpiredTokenError, InvalidKeyIdError, JoseError
from joserfc.jwk import Key, KeySet
from joserfc.jwt import JWTClaimsRegistry

from stoa_cp import jwks
from stoa_cp.auth import bearer, digest
from stoa_cp.settings import Settings

log = logging.getLogger("stoa_cp.principal")

LEEWAY_S = 30
REFRESH_INTERVAL_S = 30.0
MAX_TOKEN_CHARS = 16_384
# Asymmetric only: a symmetric algorithm would let anyone holding the public key sign.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
STATIC_ADMIN = "static-admin-token"


class Role(StrEnum):
    PLATFORM_ADMIN = "platform_admin"
    TENANT_ADMIN = "tenant_admin"
    VIEWER = "viewer"


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str
    role: Role
    # The one tenant this principal is confined to; None means platform-wide.
    tenant: str | None
    issuer: str

    @property
    def may_write(self) -> bool:
        return self.role is not Role.VIEWER

    def sees(self, tenant_id: str | None) -> bool:
        """Whether objects of `tenant_id` (None: platform objects) exist for this principal."""
        return self.tenant is None or self.tenant == tenant_id


class Refused(Exception):
    """401 (no usable credential) or 403 (a valid token that grants no role here)."""

    def __init__(self, status: int, message: str, token_given: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.token_given = token_given


def _pick(keys: KeySet | None, kid: str) -> Key | None:
    if keys is None:
        return None
    try:
        return keys.get_by_kid(kid)
    except InvalidKeyIdError:
        return None


def _b64json(segment: str) -> dict[str, Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        raise Refused(401, "the bearer token is not a JWT", True) from None
    if not isinstance(value, dict):
        raise Refused(401, "the bearer token is not a JWT", True)
    return value


@dataclass
class _Issuer:
    url: str
    keys: KeySet | None = None
    fetched_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        self._admin_digests = [digest(token) for token in settings.admin_tokens]
        self._issuers = {url: _Issuer(url) for url in settings.oidc_issuers}
        self._roles_claim = settings.roles_claim
        self._tenant_claim = settings.tenant_claim
        self._fetch_timeout_s = settings.jwks_fetch_timeout_s
        self._claims = {
            url: JWTClaimsRegistry(
                now=lambda: int(time.time()),
                leeway=LEEWAY_S,
                iss={"essential": True, "value": url},
                aud={"essential": True, "value": settings.oidc_audience},
                exp={"essential": True},
            )
            for url in settings.oidc_issuers
        }

    async def principal(self, authorization: str | None) -> Principal:
        token = bearer(authorization)
        if not token:
            raise Refused(401, "a Bearer token is required", False)
        if len(token) > MAX_TOKEN_CHARS:
            raise Refused(401, "the bearer token is too long", True)
        if self._is_admin_token(token):
            return Principal(STATIC_ADMIN, Role.PLATFORM_ADMIN, None, STATIC_ADMIN)
        if token.count(".") != 2:
            raise Refused(401, "unknown bearer token", True)
        return self._principal_of(await self._verified_claims(token))

    def _is_admin_token(self, token: str) -> bool:
        presented = digest(token)
        matched = False
        for token_digest in self._admin_digests:
            # No early exit: the time taken does not depend on which token matched.
            matched |= hmac.compare_digest(presented, token_digest)
        return matched

    async def _verified_claims(self, token: str) -> dict[str, Any]:
        head, payload, _ = token.split(".")
        header, unverified = _b64json(head), _b64json(payload)
        issuer = self._issuers.get(unverified.get("iss"))  # type: ignore[arg-type]
        if issuer is None:
            raise Refused(401, "the token's issuer is not trusted by this control plane", True)
        alg, kid = header.get("alg"), header.get("kid")
        # No JWS extension is implemented, so any critical one is refused (RFC 7515 4.1.11).
        if alg not in ALGORITHMS or "crit" in header or not isinstance(kid, str) or not kid:
            raise Refused(401, "the token's header is not acceptable (asymmetric alg and a kid)", True)
        key = await self._key(issuer, kid)
        if key is None:
            raise Refused(401, "the token is signed with a key the issuer does not publish", True)
        try:
            claims = jwt.decode(token, key, algorithms=[alg]).claims
            self._claims[issuer.url].validate(claims)
        except ExpiredTokenError:
            raise Refused(401, "the token has expired", True) from None
        except (JoseError, ValueError, TypeError, OverflowError):
            raise Refused(401, "the token is invalid (signature, audience or validity)", True) from None
        return claims

    async def _key(self, issuer: _Issuer, kid: str) -> Key | None:
        found = _pick(issuer.keys, kid)
        if found is not None:
            return found
        async with issuer.lock:
            # Another request may have refreshed the keys while this one waited for the lock.
            found = _pick(issuer.keys, kid)
            if found is not None or (
                issuer.fetched_at and time.monotonic() - issuer.fetched_at < REFRESH_INTERVAL_S
            ):
                return found
            issuer.fetched_at = time.monotonic()
            try:
                issuer.keys = await self._fetch_keys(issuer.url)
            except (jwks.JwksError, ValueError) as exc:
                log.warning("keys of trusted issuer %s could not be fetched: %s", issuer.url, exc)
                return None
        return _pick(issuer.keys, kid)

    async def _fetch_keys(self, issuer_url: str) -> KeySet:
        discovery = await jwks.fetch_json(
            f"{issuer_url.rstrip('/')}/.well-known/openid-configuration", self._fetch_timeout_s, "issuer"
        )
        uri = discovery.get("jwks_uri") if isinstance(discovery, dict) else None
        if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
            raise ValueError("the discovery document names no http(s) jwks_uri")
        return KeySet.import_key_set(await jwks.fetch(uri, self._fetch_timeout_s))  # type: ignore[arg-type]

    def _principal_of(self, claims: dict[str, Any]) -> Principal:
        raw = claims.get(self._roles_claim)
        names = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
        roles = {Role(name) for name in names if isinstance(name, str) and name in Role.__members__.values()}
        tenant = claims.get(self._tenant_claim)
        tenant = tenant if isinstance(tenant, str) and tenant else None
        subject = claims.get("sub")
        subject = subject if isinstance(subject, str) and subject else "unknown"
        issuer = str(claims["iss"])
        if Role.PLATFORM_ADMIN in roles:
            return Principal(subject, Role.PLATFORM_ADMIN, None, issuer)
        if Role.TENANT_ADMIN in roles:
            if tenant is None:
                raise Refused(403, f"a tenant_admin token must name its tenant ({self._tenant_claim})", True)
            return Principal(subject, Role.TENANT_ADMIN, tenant, issuer)
        if Role.VIEWER in roles:
            return Principal(subject, Role.VIEWER, tenant, issuer)
        raise Refused(403, f"the token grants no control-plane role ({self._roles_claim})", True)
