"""Gateway credentials (stored as SHA-256 digests). Principals (tokens with roles) are in
`stoa_cp.principal`, what each may do in `stoa_cp.access`.

Secrets are compared as digests with hmac.compare_digest and never logged; the existence of the
resources a path names is checked in `stoa_cp.dependencies`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from stoa_cp.problems import Problem
from stoa_cp.schemas import unstorable
from stoa_cp.store import gateways
from stoa_cp.store.database import Database

_gateway_bearer = HTTPBearer(
    auto_error=False, scheme_name="GatewayCredential", description="The gateway's own credential"
)
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def bearer(authorization: str | None) -> str:
    """The credential of an `Authorization: Bearer <credential>` value (the scheme in any case, spaces
    around either part allowed); "" when the value is absent, of another scheme or has no credential."""
    scheme, _, credential = (authorization or "").strip().partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


def new_credential() -> tuple[str, bytes]:
    credential = secrets.token_urlsafe(32)
    return credential, digest(credential)


def _unauthorized(message: str) -> Problem:
    return Problem(401, "Unauthorized", [("authorization", message)], headers=_CHALLENGE)


async def gateway_of(db: Database, gateway_id: str, authorization: str | None) -> str:
    """The gateway of the path, when `authorization` carries its credential (401 none or unknown, 403
    another gateway's). The authentication middleware runs it before the request body is read."""
    credential = bearer(authorization)
    if not credential:
        raise _unauthorized("a Bearer gateway credential is required")
    if unstorable(gateway_id, "gateway_id") is not None:
        raise _unauthorized("unknown gateway credential")
    presented = digest(credential)
    stored = await gateways.credential_digest(db, gateway_id)
    if stored is not None and hmac.compare_digest(presented, stored):
        return gateway_id
    if await gateways.holder_of(db, presented) is not None:
        raise Problem(403, "Forbidden", [("authorization", "this credential belongs to another gateway")])
    raise _unauthorized("unknown gateway credential")


async def require_gateway_credential(
    request: Request,
    gateway_id: Annotated[str, Path()],
    _documented: Annotated[HTTPAuthorizationCredentials | None, Depends(_gateway_bearer)],
) -> str:
    """The gateway whose credential the authentication middleware matched (the bearer dependency
    documents the scheme)."""
    if getattr(request.state, "gateway_id", None) != gateway_id:
        raise _unauthorized("a Bearer gateway credential is required")
    return gateway_id


GatewayCredential = Annotated[str, Depends(require_gateway_credential)]
