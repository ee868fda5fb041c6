"""Who is calling: admin tokens (settings) and gateway credentials (stored as SHA-256 digests).

Secrets are compared as digests with hmac.compare_digest and never logged. Each dependency here checks
a credential; the existence of the resources a path names is checked in `stoa_cp.dependencies`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from stoa_cp.dependencies import Db
from stoa_cp.problems import Problem
from stoa_cp.store import gateways

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


async def require_admin_credential(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
) -> None:
    """401 unless the caller presents one of the admin tokens of the settings."""
    if creds is None:
        raise _unauthorized("a Bearer admin token is required")
    presented = digest(creds.credentials)
    matched = False
    for token_digest in request.app.state.admin_digests:
        # No early exit: the time taken does not depend on which token matched.
        matched |= hmac.compare_digest(presented, token_digest)
    if not matched:
        raise _unauthorized("unknown admin token")


async def require_gateway_credential(
    gateway_id: Annotated[str, Path()],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_gateway_bearer)],
    db: Db,
) -> str:
    """The gateway of the path, when the caller holds its credential (401 none/unknown, 403 another's)."""
    if creds is None:
        raise _unauthorized("a Bearer gateway credential is required")
    presented = digest(creds.credentials)
    stored = await gateways.credential_digest(db, gateway_id)
    if stored is not None and hmac.compare_digest(presented, stored):
        return gateway_id
    if await gateways.holder_of(db, presented) is not None:
        raise Problem(403, "Forbidden", [("authorization", "this credential belongs to another gateway")])
    raise _unauthorized("unknown gateway credential")


AdminCredential = Depends(require_admin_credential)
GatewayCredential = Annotated[str, Depends(require_gateway_credential)]
