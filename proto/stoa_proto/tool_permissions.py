"""The contents of the signed tool permissions: the payload of the compact JWS the CP signs per gateway
(`stoa_cp.permissions`) and the MCP module verifies (`stoa_mcp.permissions`). One typed reader for the
writer and the reader, so they cannot drift apart.

Strict: integers are JSON integers (not strings, floats or booleans), lists hold strings, ids are not
empty. Claims this version does not know are ignored, as JWT readers do; the signature covers them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

__all__ = ["NotToolPermissions", "ToolGrant", "ToolPermissionClaims", "ToolRevocation", "read"]

Id = Annotated[str, StringConstraints(min_length=1)]


class _Contract(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class ToolGrant(_Contract):
    """A caller may call `tool` of `tenant_id` when it is one of `consumers` or holds one of `scopes`."""

    grant_id: Id
    tenant_id: Id
    tool: Id
    consumers: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()


class ToolRevocation(_Contract):
    """`tool` of `tenant_id` is refused to `consumer` ("": to every caller), whatever grants it."""

    revocation_id: Id
    tenant_id: Id
    tool: Id
    consumer: str = ""


class ToolPermissionClaims(_Contract):
    iss: str
    # The gateway the artifact is for.
    aud: str
    iat: int
    exp: int
    jti: Id
    # Grows by one at every signature for the gateway: a lower one than held is a rollback.
    seq: int
    grants: tuple[ToolGrant, ...]
    revocations: tuple[ToolRevocation, ...]

    def payload(self) -> dict[str, Any]:
        """The JSON object that is signed."""
        return self.model_dump(mode="json")


class NotToolPermissions(ValueError):
    """A payload that is not tool permissions; the message names the first member at fault."""


def read(payload: bytes | str) -> ToolPermissionClaims:
    """The claims of a JSON payload, or NotToolPermissions."""
    try:
        return ToolPermissionClaims.model_validate_json(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        raise NotToolPermissions(f"{where}: {first['msg']}") from None
