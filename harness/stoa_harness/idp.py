"""Development identity provider: OIDC discovery, JWKS and a client-credentials token endpoint that
mints tokens with the tenant, scopes, subject and audience the caller asks for; with a `role`
(platform_admin, tenant_admin + tenant, viewer) it mints a control-plane token carrying that role.
For development and tests only (started by the harness and `make run`, never by a service).

Key rotation keeps serving the previous public key, so tokens minted before a rotation stay valid
until they expire while tokens after it carry the new `kid`. Helpers mint deliberately bad tokens.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any, Literal
from urllib.parse import parse_qs

from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stoa_harness.asgi_thread import ServedByThread, ThreadedASGIServer

Algorithm = Literal["RS256", "ES256"]
DEFAULT_LIFETIME_S = 300
# Tokens for the control plane's API: its roles claim and its default audience (STOA_CP_*).
CP_ROLES = ("platform_admin", "tenant_admin", "viewer")
CP_ROLES_CLAIM = "stoa_roles"
CP_AUDIENCE = "stoa-cp"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _new_key(alg: Algorithm) -> RSAKey | ECKey:
    key: RSAKey | ECKey = RSAKey.generate_key(2048) if alg == "RS256" else ECKey.generate_key("P-256")
    key.ensure_kid()
    return key


class DevIdentityProvider(ServedByThread):
    def __init__(self, alg: Algorithm = "RS256", audience: str = "stoa") -> None:
        self.alg: Algorithm = alg
        self.audience = audience
        self._key = _new_key(alg)
        self._previous: RSAKey | ECKey | None = None
        self._http = ThreadedASGIServer(self._app(), "dev-idp")

    # ---- addresses (start and stop: ServedByThread) ---------------------------------------------
    @property
    def base_url(self) -> str:
        return self.url

    issuer = base_url

    @property
    def jwks_uri(self) -> str:
        return f"{self.base_url}/jwks"

    @property
    def token_url(self) -> str:
        return f"{self.base_url}/token"

    @property
    def kid(self) -> str:
        return str(self._key.kid)

    @property
    def signing_key(self) -> RSAKey | ECKey:
        """The current private key, for tests that sign what no JOSE library would produce."""
        return self._key

    # ---- keys ------------------------------------------------------------------------------------
    def rotate(self) -> str:
        """A new signing key with a new kid; the previous public key stays published. Returns the kid."""
        self._previous = self._key
        self._key = _new_key(self.alg)
        return self.kid

    def jwks(self) -> dict[str, Any]:
        keys = [self._key] + ([self._previous] if self._previous is not None else [])
        return {"keys": [self._public(k) for k in keys]}

    def _public(self, key: RSAKey | ECKey) -> dict[str, Any]:
        data = key.as_dict(private=False)
        data.update({"kid": key.kid, "alg": self.alg, "use": "sig"})
        return data

    # ---- tokens ----------------------------------------------------------------------------------
    def claims(
        self,
        tenant: str | None = "demo",
        scope: str | None = "",
        sub: str = "dev-client",
        audience: str | list[str] | None = None,
        lifetime_s: int = DEFAULT_LIFETIME_S,
        **extra: Any,
    ) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.base_url,
            "sub": sub,
            "aud": audience if audience is not None else self.audience,
            "iat": now,
            "nbf": now,
            "exp": now + lifetime_s,
            "jti": _b64(hashlib.sha256(f"{now}{time.perf_counter_ns()}".encode()).digest()[:12]),
        }
        if tenant is not None:
            claims["tenant_id"] = tenant
        if scope:
            claims["scope"] = scope
        claims.update(extra)
        return {k: v for k, v in claims.items() if v is not None}

    def sign(self, claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
        return jwt.encode(
            {"alg": self.alg, "kid": self._key.kid, "typ": "JWT", **(header or {})}, claims, self._key
        )

    def mint(self, **kwargs: Any) -> str:
        return self.sign(self.claims(**kwargs))

    def role_token(self, role: str, tenant: str | None = None, sub: str | None = None, **kwargs: Any) -> str:
        """A control-plane token: `role` in the roles claim, the tenant claim only when given."""
        if role not in CP_ROLES:
            raise ValueError(f"role must be one of {', '.join(CP_ROLES)}")
        kwargs.setdefault("audience", CP_AUDIENCE)
        return self.mint(tenant=tenant, sub=sub or f"dev-{role}", **{CP_ROLES_CLAIM: [role]}, **kwargs)

    # Deliberately bad tokens, for tests.
    def expired(self, **kwargs: Any) -> str:
        claims = self.claims(**kwargs)
        claims.update(iat=claims["iat"] - 3600, nbf=claims["nbf"] - 3600, exp=claims["iat"] - 600)
        return self.sign(claims)

    def not_yet_valid(self, **kwargs: Any) -> str:
        claims = self.claims(**kwargs)
        claims.update(nbf=claims["nbf"] + 600, exp=claims["exp"] + 600)
        return self.sign(claims)

    def wrong_audience(self, **kwargs: Any) -> str:
        return self.mint(audience="someone-else", **kwargs)

    def other_issuer(self, **kwargs: Any) -> str:
        """Signed by a key nobody trusts, naming an issuer nobody trusts."""
        stranger = _new_key(self.alg)
        claims = self.claims(**kwargs)
        claims["iss"] = "https://stranger.invalid"
        return jwt.encode({"alg": self.alg, "kid": stranger.kid}, claims, stranger)

    def alg_none(self, **kwargs: Any) -> str:
        header = {"alg": "none", "kid": self.kid, "typ": "JWT"}
        return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(self.claims(**kwargs)).encode())}."

    def hs256_with_public_key(self, **kwargs: Any) -> str:
        """The classic confusion attack: HMAC keyed with the published public key (PEM)."""
        header = {"alg": "HS256", "kid": self.kid, "typ": "JWT"}
        signing_input = (
            f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(self.claims(**kwargs)).encode())}"
        )
        secret = self._key.as_pem(private=False)
        signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(signature)}"

    def bad_signature(self, **kwargs: Any) -> str:
        head, payload, signature = self.mint(**kwargs).split(".")
        raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
        raw[len(raw) // 2] ^= 0xFF
        return f"{head}.{payload}.{_b64(bytes(raw))}"

    # ---- HTTP ------------------------------------------------------------------------------------
    def _app(self) -> Starlette:
        async def discovery(_request: Request) -> Response:
            return JSONResponse(
                {
                    "issuer": self.base_url,
                    "jwks_uri": self.jwks_uri,
                    "token_endpoint": self.token_url,
                    "grant_types_supported": ["client_credentials"],
                    "id_token_signing_alg_values_supported": [self.alg],
                    "token_endpoint_auth_methods_supported": ["none"],
                }
            )

        async def jwks(_request: Request) -> Response:
            return JSONResponse(self.jwks())

        async def token(request: Request) -> Response:
            fields = parse_qs((await request.body()).decode("utf-8", "replace"))
            # RFC 6749 5.2: a missing or repeated parameter is invalid_request.
            if "grant_type" not in fields or any(len(values) > 1 for values in fields.values()):
                return JSONResponse({"error": "invalid_request"}, status_code=400)
            form = {k: v[0] for k, v in fields.items()}
            if form["grant_type"] != "client_credentials":
                return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
            scope = form.get("scope", "")
            role = form.get("role")
            if role is not None:
                # A control-plane token: a tenant admin needs its tenant; no default tenant otherwise.
                if role not in CP_ROLES or (role == "tenant_admin" and not form.get("tenant")):
                    return JSONResponse({"error": "invalid_request"}, status_code=400)
                access_token = self.role_token(
                    role,
                    tenant=form.get("tenant") or None,
                    sub=form.get("sub") or None,
                    scope=scope,
                    audience=form.get("audience") or CP_AUDIENCE,
                )
            else:
                access_token = self.mint(
                    tenant=form.get("tenant", "demo"),
                    scope=scope,
                    sub=form.get("sub", "dev-client"),
                    audience=form.get("audience") or None,
                )
            return JSONResponse(
                {
                    "access_token": access_token,
                    "token_type": "Bearer",
                    "expires_in": DEFAULT_LIFETIME_S,
                    "scope": scope,
                },
                headers={"cache-control": "no-store"},
            )

        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", discovery),
                Route("/jwks", jwks),
                Route("/token", token, methods=["POST"]),
            ]
        )
