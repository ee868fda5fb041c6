"""Who is calling: admin tokens (settings) and gateway credentials (stored as SHA-256 digests).

Secrets are compared as digests with hmac.compare_digest and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated

import asyncpg
from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from stoa_cp.problems import Problem

_admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken", description="An admin token")
_gateway_bearer = HTTPBearer(
    auto_error=False, scheme_name="GatewayCredential", description="The gateway's own credential"
)
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_credential() -> tuple[str, bytes]:
    credential = secrets.token_urlsafe(32)
    return credential, digest(credential)


def _unauthorized(message: str) -> Problem:
    return Problem(401, "Unauthorized", [("authorization", message)], headers=_CHALLENGE)


def pool(request: Request) -> asyncpg.Pool:
    return request.app.state.pool  # type: ignore[no-any-return]


async def require_admin(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
) -> None:
    if creds is None:
        raise _unauthorized("a Bearer admin token is required")
    presented = digest(creds.credentials)
    matched = False
    for token_digest in request.app.state.admin_digests:
        # No early exit: the time taken does not depend on which token matched.
        matched |= hmac.compare_digest(presented, token_digest)
    if not matched:
        raise _unauthorized("unknown admin token")


async def require_gateway(
    request: Request,
    gateway_id: Annotated[str, Path()],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_gateway_bearer)],
) -> str:
    """The gateway of the path, when the caller holds its credential (401 none/unknown, 403 another's)."""
    if creds is None:
        raise _unauthorized("a Bearer gateway credential is required")
    presented = digest(creds.credentials)
    async with pool(request).acquire() as conn:
        stored = await conn.fetchval(
            "SELECT credential_sha256 FROM gateways WHERE gateway_id = $1", gateway_id
        )
        if stored is not None and hmac.compare_digest(presented, bytes(stored)):
            return gateway_id
        # Lookup by digest of a high-entropy secret: reveals nothing usable about any credential.
        other = await conn.fetchval("SELECT 1 FROM gateways WHERE credential_sha256 = $1", presented)
    if other is not None:
        raise Problem(403, "Forbidden", [("authorization", "this credential belongs to another gateway")])
    raise _unauthorized("unknown gateway credential")


Admin = Depends(require_admin)
Db = Annotated[asyncpg.Pool, Depends(pool)]
