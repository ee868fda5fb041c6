"""Phase 3, identify: a bearer JWT checked against the keys of an issuer the route's tenant trusts.

Asymmetric algorithms only (the allowed set comes from the key: a symmetric key never loads, so
neither `none` nor HMAC-with-a-public-key can verify); `iss`, `aud`, `exp` and `sub` required (RFC
9068); `exp`/`nbf` with a small leeway; a lifetime (`exp - iat`, or `exp - now` without `iat`) above
the maximum is refused, so a stolen long-lived token is not honoured. A `sub` is copied into an
upstream header: one that would not arrive unchanged (a control character, a space at either end,
anything beyond ASCII: `stoa_proto.decisions.HEADER_CLAIM`) is an invalid token, never a 503. An
unknown `kid` triggers at most one bounded JWKS fetch per issuer and interval. (Check caches the
decision for a verified token until the token expires.)

On a route whose token Envoy's `jwt_authn` filter verified, the identity is read from that filter's
verified payload in the Check's `metadata_context`, under the filter's own namespace only: dynamic
metadata is written by Envoy's filters, never by a client, and no other namespace is read.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from envoy.config.core.v3.base_pb2 import Metadata
from google.protobuf import json_format
from joserfc import jwt
from joserfc.errors import ExpiredTokenError, JoseError
from joserfc.jwt import JWTClaimsRegistry
from stoa_proto.decisions import BEARER_SCHEMES, CLOCK_SKEW_S, is_header_claim

from stoa_authz.policy import PolicyError, Route, TrustedIssuer, VerificationKey, parse_jwks
from stoa_authz.reasons import Deny, Reason

LEEWAY_S = CLOCK_SKEW_S
DEFAULT_MAX_LIFETIME_S = 86_400
REFRESH_INTERVAL_S = 30.0
_MAX_TOKEN_BYTES = 16_384
# Where jwt_authn puts the payload of the token it verified (the Link configures the same key).
JWT_AUTHN_NAMESPACE = "envoy.filters.http.jwt_authn"
VERIFIED_PAYLOAD_KEY = "payload"

log = logging.getLogger("stoa_authz.identify")


@dataclass(frozen=True, slots=True)
class Identity:
    subject: str
    tenant: str | None
    scopes: frozenset[str]
    expires_at: float
    # The OAuth client the token was issued to (`azp`, else `client_id`): names its consumer.
    client_id: str | None = None


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose member names are unique. A repeated claim (`"tenant_id": "other", ...,
    "tenant_id": "demo"`) is read as its last member here but as its first, or refused, by other
    parsers (Envoy's jwt_authn refuses it): a token that means different things to different readers
    is refused (RFC 7519 section 4 allows either)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("a member name is repeated")
    return value


def _b64json(segment: str) -> dict[str, Any]:
    padded = segment + "=" * (-len(segment) % 4)
    try:
        value = json.loads(base64.urlsafe_b64decode(padded), object_pairs_hook=_unique_members)
    except RecursionError as exc:  # deeply nested JSON: malformed, not an internal error
        raise ValueError("JSON nested too deeply") from exc
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def granted_scopes(claims: dict[str, Any]) -> frozenset[str]:
    scopes: set[str] = set()
    scope = claims.get("scope")
    if isinstance(scope, str):
        scopes.update(scope.split())
    scp = claims.get("scp")
    if isinstance(scp, str):
        scopes.update(scp.split())
    elif isinstance(scp, list):
        scopes.update(s for s in scp if isinstance(s, str))
    return frozenset(scopes)


def identity_of(claims: dict[str, Any], tenant_claim: str) -> Identity:
    """The identity in the claims of a verified token (exp is required by both verifiers)."""
    try:
        expires_at = float(claims["exp"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        # OverflowError: an integer beyond any date (the library checks only its type).
        raise Deny(Reason.INVALID_TOKEN) from exc
    subject = claims.get("sub")
    # Copied into an upstream header: only a value that arrives unchanged (the rule Envoy applies too).
    if not is_header_claim(subject):
        raise Deny(Reason.INVALID_TOKEN)
    tenant = claims.get(tenant_claim)
    client = claims.get("azp") or claims.get("client_id")
    return Identity(
        subject=subject,
        tenant=tenant if isinstance(tenant, str) else None,
        scopes=granted_scopes(claims),
        expires_at=expires_at,
        client_id=client if isinstance(client, str) else None,
    )


def verified_payload(metadata: Metadata) -> dict[str, Any]:
    """The payload jwt_authn verified for this request. Its absence on a route whose token Envoy
    verifies means Envoy was not configured as the policy set says: fail closed."""
    namespace = metadata.filter_metadata.get(JWT_AUTHN_NAMESPACE)
    if namespace is None or VERIFIED_PAYLOAD_KEY not in namespace.fields:
        raise Deny(Reason.INTERNAL_ERROR)
    payload = namespace.fields[VERIFIED_PAYLOAD_KEY]
    if payload.WhichOneof("kind") != "struct_value":
        raise Deny(Reason.INTERNAL_ERROR)
    return json_format.MessageToDict(payload.struct_value)


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise Deny(Reason.MISSING_TOKEN)
    scheme, _, token = authorization.strip().partition(" ")
    if scheme not in BEARER_SCHEMES:
        raise Deny(Reason.MISSING_TOKEN)
    token = token.strip()
    if not token or len(token) > _MAX_TOKEN_BYTES:
        raise Deny(Reason.INVALID_TOKEN)
    return token


class Identifier:
    def __init__(
        self,
        audience: str,
        tenant_claim: str,
        fetch_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S,
    ) -> None:
        self._tenant_claim = tenant_claim
        self._max_lifetime_s = max_lifetime_s
        self._fetch_timeout_s = fetch_timeout_s
        self.clock = clock
        self._claims = JWTClaimsRegistry(
            now=lambda: int(self.clock()),
            leeway=LEEWAY_S,
            iss={"essential": True},
            aud={"essential": True, "value": audience},
            exp={"essential": True},
            sub={"essential": True},
        )

    def identify(self, token: str, route: Route) -> Identity:
        """The verified identity of `token` on `route`, or Deny. (Check caches the outcome.)"""
        parts = token.split(".")
        if len(parts) != 3:
            raise Deny(Reason.INVALID_TOKEN)
        try:
            header = _b64json(parts[0])
            unverified = _b64json(parts[1])
        except (ValueError, binascii.Error) as exc:
            raise Deny(Reason.INVALID_TOKEN) from exc
        issuer_name = unverified.get("iss")
        if not isinstance(issuer_name, str) or not issuer_name:
            # Named no issuer the route trusts (Envoy's jwt_authn says the same: issuer not configured).
            raise Deny(Reason.WRONG_ISSUER)
        issuer = route.issuers.get(issuer_name)
        if issuer is None:
            raise Deny(Reason.WRONG_ISSUER)
        alg = header.get("alg")
        kid = header.get("kid", "")
        # No JWS extension is implemented, so a token naming any critical one is refused (RFC 7515
        # 4.1.11); the library would accept e.g. "b64" or an empty list.
        if not isinstance(alg, str) or not isinstance(kid, str) or "crit" in header:
            raise Deny(Reason.INVALID_TOKEN)
        key = self._key(issuer, kid)
        if key is None or alg not in key.algorithms:
            raise Deny(Reason.INVALID_TOKEN)
        try:
            claims = jwt.decode(token, key.key, algorithms=[alg]).claims
        except (JoseError, ValueError) as exc:
            raise Deny(Reason.INVALID_TOKEN) from exc
        try:
            self._claims.validate(claims)
        except ExpiredTokenError as exc:
            raise Deny(Reason.EXPIRED_TOKEN) from exc
        except JoseError as exc:  # missing or invalid claim: aud has its own reason
            wrong_aud = getattr(exc, "claim", "") == "aud"
            raise Deny(Reason.WRONG_AUDIENCE if wrong_aud else Reason.INVALID_TOKEN) from exc
        identity = identity_of(claims, self._tenant_claim)
        issued_at = claims.get("iat")
        try:
            # The library checks iat's type only when present; anything else counts from now.
            start = float(issued_at) if isinstance(issued_at, int | float) else self.clock()
        except OverflowError as exc:  # an integer beyond any date (the library checks only its type)
            raise Deny(Reason.INVALID_TOKEN) from exc
        if identity.expires_at - start > self._max_lifetime_s:
            raise Deny(Reason.INVALID_TOKEN)
        return identity

    def from_envoy(self, metadata: Metadata) -> Identity:
        """The identity of a token Envoy verified (the route says so); never verified again here."""
        identity = identity_of(verified_payload(metadata), self._tenant_claim)
        if self.clock() > identity.expires_at + LEEWAY_S:  # cannot happen unless clocks disagree
            raise Deny(Reason.EXPIRED_TOKEN)
        return identity

    def _key(self, issuer: TrustedIssuer, kid: str) -> VerificationKey | None:
        key = self._pick(issuer.keys, kid)
        if key is not None or not issuer.jwks_uri:
            return key
        now = time.monotonic()
        if issuer.last_refresh and now - issuer.last_refresh < REFRESH_INTERVAL_S:
            return None
        issuer.last_refresh = now
        try:
            # Blocks this Check's worker thread only, for at most the fetch timeout.
            with httpx.Client(timeout=self._fetch_timeout_s) as client:
                response = client.get(issuer.jwks_uri)
                response.raise_for_status()
            fetched = parse_jwks(response.text, f"JWKS of {issuer.issuer}")
        except (httpx.HTTPError, PolicyError) as exc:
            # The issuer URL is a claim value: not logged.
            log.warning("jwks_refresh_failed", extra={"error": type(exc).__name__})
            return None
        issuer.keys = {**issuer.keys, **fetched}
        return self._pick(issuer.keys, kid)

    @staticmethod
    def _pick(keys: dict[str, VerificationKey], kid: str) -> VerificationKey | None:
        if kid:
            return keys.get(kid)
        # A token without kid is only unambiguous against a single key.
        return next(iter(keys.values())) if len(keys) == 1 else None
