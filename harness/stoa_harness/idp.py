"""Development identity provider: OIDC discovery, JWKS and a client-credentials token endpoint that
mints tokens with the tenant, scopes, subject and audience the caller asks for; with a `role`
(platform_admin, tenant_admin + tenant, viewer) it mints a control-plane token carrying that role.
For development and tests only (started by the harness and `make run`, never by a service).

People sign in with the authorization code flow and PKCE (RFC 6749 4.1, RFC 7636, S256 only), the
way the console does: `/authorize` shows a sign-in page for the dev users (`DEV_USERS`: a platform
admin and the demo tenant's admin, or the users given), a one-time code bound to the client, the
redirect URI and the code challenge is returned to the redirect URI, and `/token` exchanges it for a
control-plane token of the user's role. The one client is the console (`CONSOLE_CLIENT_ID`), whose
redirect URIs are loopback `http` URLs on any port (RFC 8252 7.3) ending in `/console/callback`.
Browsers on loopback origins may call discovery and the token endpoint (CORS).

Key rotation keeps serving the previous public key, so tokens minted before a rotation stay valid
until they expire while tokens after it carry the new `kid`. Helpers mint deliberately bad tokens.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode, urlsplit

from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from stoa_harness.asgi_thread import ServedByThread, ThreadedASGIServer

Algorithm = Literal["RS256", "ES256"]
DEFAULT_LIFETIME_S = 300
# Tokens for the control plane's API: its roles claim and its default audience (STOA_CP_*).
CP_ROLES = ("platform_admin", "tenant_admin", "viewer")
CP_ROLES_CLAIM = "stoa_roles"
CP_AUDIENCE = "stoa-cp"
# The console, a public client (no secret: PKCE binds the code to the browser that asked for it).
CONSOLE_CLIENT_ID = "stoa-console"
CODE_LIFETIME_S = 60
# A console sign-in lasts a working hour; the console asks for a new sign-in after it.
SIGN_IN_LIFETIME_S = 3600
# RFC 7636 4.1: 43 to 128 unreserved characters; an S256 challenge is 43 base64url characters.
_VERIFIER = re.compile(r"^[A-Za-z0-9._~-]{43,128}$")
_CHALLENGE = re.compile(r"^[A-Za-z0-9_-]{43}$")
_LOOPBACK_ORIGIN = r"^http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?$"


@dataclass(frozen=True)
class DevUser:
    """A person who may sign in, and the control-plane role their tokens carry."""

    username: str
    password: str
    role: str
    tenant: str | None = None


# `make run`'s users: a platform admin and the demo tenant's admin (printed by `make run`).
DEV_USERS = (
    DevUser("admin", "admin", "platform_admin"),
    DevUser("alice", "alice", "tenant_admin", "demo"),
)


@dataclass(frozen=True)
class _Grant:
    client_id: str
    redirect_uri: str
    challenge: str
    user: DevUser
    expires_at: float


def console_redirect_uri(uri: str) -> bool:
    """The console's redirect URIs: loopback http on any port, path ending in /console/callback, no
    fragment (RFC 6749 3.1.2)."""
    try:
        parts = urlsplit(uri)
        host = parts.hostname
        _ = parts.port  # a malformed port raises
    except ValueError:
        return False
    return (
        parts.scheme == "http"
        and host in ("127.0.0.1", "localhost", "::1")
        and parts.path.endswith("/console/callback")
        and not parts.fragment
        and parts.username is None
    )


def s256(verifier: str) -> str:
    """The PKCE S256 challenge of a code verifier."""
    return _b64(hashlib.sha256(verifier.encode("ascii")).digest())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _new_key(alg: Algorithm) -> RSAKey | ECKey:
    key: RSAKey | ECKey = RSAKey.generate_key(2048) if alg == "RS256" else ECKey.generate_key("P-256")
    key.ensure_kid()
    return key


class DevIdentityProvider(ServedByThread):
    def __init__(
        self, alg: Algorithm = "RS256", audience: str = "stoa", users: Iterable[DevUser] = DEV_USERS
    ) -> None:
        self.alg: Algorithm = alg
        self.audience = audience
        self._key = _new_key(alg)
        self._previous: RSAKey | ECKey | None = None
        self.users = {user.username: user for user in users}
        for user in self.users.values():
            if user.role not in CP_ROLES or (user.role == "tenant_admin" and not user.tenant):
                raise ValueError(f"dev user {user.username!r}: not a role this provider can mint")
        self._grants: dict[str, _Grant] = {}
        self._grants_lock = threading.Lock()
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
    def authorize_url(self) -> str:
        return f"{self.base_url}/authorize"

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

    # ---- sign-in (authorization code + PKCE) ------------------------------------------------------
    def user(self, username: str, password: str) -> DevUser | None:
        """The dev user these credentials name, or None (the password compared in constant time)."""
        user = self.users.get(username)
        given = hashlib.sha256(password.encode()).digest()
        expected = hashlib.sha256((user.password if user else secrets.token_hex(16)).encode()).digest()
        return user if hmac.compare_digest(given, expected) and user is not None else None

    def issue_code(self, client_id: str, redirect_uri: str, challenge: str, user: DevUser) -> str:
        code = secrets.token_urlsafe(32)
        with self._grants_lock:
            now = time.monotonic()
            # Unused codes expire: drop them, so the table stays as small as the sign-ins in flight.
            self._grants = {k: g for k, g in self._grants.items() if g.expires_at > now}
            self._grants[code] = _Grant(client_id, redirect_uri, challenge, user, now + CODE_LIFETIME_S)
        return code

    def redeem(self, code: str, client_id: str, redirect_uri: str, verifier: str) -> DevUser | None:
        """The user a code was issued to, when the code is fresh, unused and issued to this client and
        redirect URI, and the verifier matches its challenge; a code is used up by any attempt."""
        with self._grants_lock:
            grant = self._grants.pop(code, None)
        if grant is None or grant.expires_at <= time.monotonic() or not _VERIFIER.match(verifier):
            return None
        if grant.client_id != client_id or grant.redirect_uri != redirect_uri:
            return None
        return grant.user if hmac.compare_digest(s256(verifier), grant.challenge) else None

    def sign_in_token(self, user: DevUser) -> str:
        return self.role_token(
            user.role, tenant=user.tenant, sub=user.username, lifetime_s=SIGN_IN_LIFETIME_S
        )

    def _sign_in_page(self, params: dict[str, str], error: str = "", status: int = 200) -> Response:
        hidden = "".join(
            f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
            for k, v in params.items()
            if k
            in (
                "response_type",
                "client_id",
                "redirect_uri",
                "state",
                "code_challenge",
                "code_challenge_method",
                "scope",
            )
        )
        users = "".join(
            f"<li><code>{html.escape(u.username)}</code> / <code>{html.escape(u.password)}</code>: "
            f"{html.escape(u.role.replace('_', ' '))}"
            + (f" of <code>{html.escape(u.tenant)}</code>" if u.tenant else "")
            + "</li>"
            for u in self.users.values()
        )
        alert = f'<p id="sign-in-error" role="alert">{html.escape(error)}</p>' if error else ""
        page = _SIGN_IN_PAGE.format(hidden=hidden, users=users, alert=alert)
        return HTMLResponse(
            page,
            status_code=status,
            headers={
                "cache-control": "no-store",
                # No form-action: the answer to the form redirects to the client's own origin.
                "content-security-policy": (
                    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
                ),
                "x-frame-options": "DENY",
            },
        )

    def _check_authorize(self, params: dict[str, str]) -> tuple[Response | None, str | None]:
        """(an answer that ends the request, None) or (None, None) when the request is acceptable.
        The client and redirect URI are checked first: an unchecked URI is never redirected to."""
        if params.get("client_id") != CONSOLE_CLIENT_ID:
            return HTMLResponse("unknown client_id", status_code=400), None
        redirect_uri = params.get("redirect_uri", "")
        if not console_redirect_uri(redirect_uri):
            return HTMLResponse("redirect_uri is not registered for this client", status_code=400), None
        error = None
        if params.get("response_type") != "code":
            error = "unsupported_response_type"
        elif params.get("code_challenge_method") != "S256" or not _CHALLENGE.match(
            params.get("code_challenge", "")
        ):
            error = "invalid_request"  # PKCE with S256 is required (RFC 7636 4.4.1)
        if error is None:
            return None, None
        return self._back(redirect_uri, params, error=error), error

    @staticmethod
    def _back(redirect_uri: str, params: dict[str, str], **answer: str) -> Response:
        query = dict(answer)
        if "state" in params:
            query["state"] = params["state"]
        separator = "&" if "?" in redirect_uri else "?"
        return RedirectResponse(f"{redirect_uri}{separator}{urlencode(query)}", status_code=303)

    # ---- HTTP ------------------------------------------------------------------------------------
    def _app(self) -> Starlette:
        async def discovery(_request: Request) -> Response:
            return JSONResponse(
                {
                    "issuer": self.base_url,
                    "jwks_uri": self.jwks_uri,
                    "token_endpoint": self.token_url,
                    "authorization_endpoint": self.authorize_url,
                    "response_types_supported": ["code"],
                    "grant_types_supported": ["authorization_code", "client_credentials"],
                    "code_challenge_methods_supported": ["S256"],
                    "id_token_signing_alg_values_supported": [self.alg],
                    "token_endpoint_auth_methods_supported": ["none"],
                }
            )

        def single(fields: dict[str, list[str]]) -> dict[str, str] | None:
            # RFC 6749 3.1: a parameter sent more than once is invalid.
            if any(len(values) > 1 for values in fields.values()):
                return None
            return {k: v[0] for k, v in fields.items()}

        async def authorize(request: Request) -> Response:
            if request.method == "GET":
                params = single(parse_qs(request.url.query))
            else:
                params = single(parse_qs((await request.body()).decode("utf-8", "replace")))
            if params is None:
                return HTMLResponse("a parameter is repeated", status_code=400)
            refused, _ = self._check_authorize(params)
            if refused is not None:
                return refused
            if request.method == "GET":
                return self._sign_in_page(params)
            user = self.user(params.get("username", ""), params.get("password", ""))
            if user is None:
                return self._sign_in_page(params, "Unknown user name or wrong password.", status=401)
            code = self.issue_code(CONSOLE_CLIENT_ID, params["redirect_uri"], params["code_challenge"], user)
            return self._back(params["redirect_uri"], params, code=code)

        async def jwks(_request: Request) -> Response:
            return JSONResponse(self.jwks())

        async def token(request: Request) -> Response:
            fields = parse_qs((await request.body()).decode("utf-8", "replace"))
            # RFC 6749 5.2: a missing or repeated parameter is invalid_request.
            if "grant_type" not in fields or any(len(values) > 1 for values in fields.values()):
                return JSONResponse({"error": "invalid_request"}, status_code=400)
            form = {k: v[0] for k, v in fields.items()}
            if form["grant_type"] == "authorization_code":
                user = self.redeem(
                    form.get("code", ""),
                    form.get("client_id", ""),
                    form.get("redirect_uri", ""),
                    form.get("code_verifier", ""),
                )
                if user is None:
                    return JSONResponse({"error": "invalid_grant"}, status_code=400)
                return JSONResponse(
                    {
                        "access_token": self.sign_in_token(user),
                        "token_type": "Bearer",
                        "expires_in": SIGN_IN_LIFETIME_S,
                        "scope": "openid",
                    },
                    headers={"cache-control": "no-store"},
                )
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
                Route("/authorize", authorize, methods=["GET", "POST"]),
                Route("/token", token, methods=["POST"]),
            ],
            # A browser on a loopback origin (the console) reads discovery and redeems its code.
            middleware=[
                Middleware(
                    CORSMiddleware,
                    allow_origin_regex=_LOOPBACK_ORIGIN,
                    allow_methods=["GET", "POST"],
                    allow_headers=["content-type"],
                )
            ],
        )


_SIGN_IN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>Sign in: STOA dev identity provider</title>
<style>
body {{ font: 16px/1.5 system-ui, sans-serif; color: #1a1a1a; background: #f4f4f4; margin: 0; }}
main {{ max-width: 26rem; margin: 4rem auto; background: #fff; padding: 2rem; border: 1px solid #767676; }}
label {{ display: block; margin-top: 1rem; font-weight: 600; }}
input[type=text], input[type=password] {{ width: 100%; padding: .5rem; font: inherit;
  border: 1px solid #595959; box-sizing: border-box; }}
button {{ margin-top: 1.5rem; padding: .6rem 1.2rem; font: inherit; background: #0b5394; color: #fff;
  border: 0; cursor: pointer; }}
:focus-visible {{ outline: 3px solid #b35c00; outline-offset: 2px; }}
[role=alert] {{ color: #a50000; font-weight: 600; }}
</style></head>
<body><main>
<h1>Sign in</h1>
<p>STOA development identity provider: for development only.</p>
{alert}
<form method="post" action="authorize">
{hidden}
<label for="username">User name</label>
<input id="username" name="username" type="text" autocomplete="username" required autofocus>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit" id="sign-in">Sign in</button>
</form>
<h2>Development users</h2>
<ul>{users}</ul>
</main></body></html>
"""
