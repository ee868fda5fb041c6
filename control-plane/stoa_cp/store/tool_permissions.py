"""The signed tool permissions of each gateway: what they hold, and when they are signed again.

One row per gateway holds the current artifact. `resign` (inside the transaction of the change that
calls it, or of the keeper's round) rebuilds the content — the grants and revocations of the tenants
with an MCP route on the gateway — and signs a new artifact with the next `seq` when the content
changed, the signing key changed, or the current one is past half its life. The row lock serialises
CP replicas, so `seq` strictly grows. A new artifact is announced on its own channel: it is not a
change of the gateway's desired state, so no generation moves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import asyncpg
from stoa_proto.tool_permissions import ToolGrant, ToolPermissionClaims, ToolRevocation

log = logging.getLogger("stoa_cp.tool_permissions")

CHANNEL = "stoa_tool_permissions"


class Signer(Protocol):
    """Signs a payload as a compact JWS (`stoa_cp.permissions.Signer`)."""

    issuer: str
    lifetime_s: int

    def active_kid(self) -> str: ...

    def sign(self, payload: dict[str, Any]) -> tuple[str, str]:
        """(kid, compact JWS)."""
        ...


@dataclass(frozen=True)
class Current:
    seq: int
    jws: str


async def content(
    conn: asyncpg.Connection, gateway_id: str
) -> tuple[tuple[ToolGrant, ...], tuple[ToolRevocation, ...]]:
    """The grants and revocations of the tenants with an MCP route on the gateway."""
    tenants = [
        row["tenant_id"]
        for row in await conn.fetch(
            "SELECT DISTINCT a.tenant_id FROM deployments d JOIN apis a ON a.api_id = d.api_id"
            " WHERE d.gateway_id = $1 AND a.kind = 'mcp' ORDER BY 1",
            gateway_id,
        )
    ]
    grants = await conn.fetch(
        "SELECT grant_id, tenant_id, tool, consumers, scopes FROM tool_grants"
        " WHERE tenant_id = ANY($1::text[]) ORDER BY tenant_id, grant_id",
        tenants,
    )
    revocations = await conn.fetch(
        "SELECT revocation_id, tenant_id, tool, coalesce(consumer, '') AS consumer FROM tool_revocations"
        " WHERE tenant_id = ANY($1::text[]) ORDER BY tenant_id, revocation_id",
        tenants,
    )
    return (
        tuple(
            ToolGrant(
                grant_id=g["grant_id"],
                tenant_id=g["tenant_id"],
                tool=g["tool"],
                consumers=tuple(g["consumers"]),
                scopes=tuple(g["scopes"]),
            )
            for g in grants
        ),
        tuple(ToolRevocation(**dict(r)) for r in revocations),
    )


def _digest(grants: tuple[ToolGrant, ...], revocations: tuple[ToolRevocation, ...]) -> str:
    value = {
        "grants": [g.model_dump(mode="json") for g in grants],
        "revocations": [r.model_dump(mode="json") for r in revocations],
    }
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def resign(
    conn: asyncpg.Connection,
    gateway_ids: Iterable[str],
    signer: Signer | None,
    clock: Any = time.time,
) -> dict[str, int]:
    """Sign each gateway's permissions again where they need it; gateway → the new seq."""
    if signer is None:
        return {}
    signed: dict[str, int] = {}
    for gateway_id in sorted(set(gateway_ids)):
        await conn.execute(
            "INSERT INTO tool_permissions (gateway_id, seq, jti, kid, digest, jws, issued_at, expires_at)"
            " SELECT $1, 0, '', '', '', '', now(), now() WHERE EXISTS"
            " (SELECT 1 FROM gateways WHERE gateway_id = $1) ON CONFLICT (gateway_id) DO NOTHING",
            gateway_id,
        )
        row = await conn.fetchrow(
            "SELECT seq, kid, digest, expires_at FROM tool_permissions WHERE gateway_id = $1 FOR UPDATE",
            gateway_id,
        )
        if row is None:
            continue
        grants, revocations = await content(conn, gateway_id)
        digest = _digest(grants, revocations)
        now = clock()
        remaining = row["expires_at"].timestamp() - now
        if (
            row["seq"] > 0
            and row["digest"] == digest
            and row["kid"] == signer.active_kid()
            and remaining > signer.lifetime_s / 2
        ):
            continue
        seq = int(row["seq"]) + 1
        issued = int(now)
        claims = ToolPermissionClaims(
            iss=signer.issuer,
            aud=gateway_id,
            iat=issued,
            exp=issued + signer.lifetime_s,
            jti=secrets.token_hex(16),
            seq=seq,
            grants=grants,
            revocations=revocations,
        )
        kid, jws = signer.sign(claims.payload())
        await conn.execute(
            "UPDATE tool_permissions SET seq = $2, jti = $3, kid = $4, digest = $5, jws = $6, issued_at = $7,"
            " expires_at = $8 WHERE gateway_id = $1",
            gateway_id,
            seq,
            claims.jti,
            kid,
            digest,
            jws,
            datetime.fromtimestamp(issued, UTC),
            datetime.fromtimestamp(claims.exp, UTC),
        )
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, gateway_id)
        signed[gateway_id] = seq
        log.info(
            "tool_permissions_signed gateway=%s seq=%d kid=%s grants=%d revocations=%d",
            gateway_id,
            seq,
            kid,
            len(grants),
            len(revocations),
        )
    return signed


async def current(conn: asyncpg.Connection, gateway_id: str) -> Current | None:
    row = await conn.fetchrow(
        "SELECT seq, jws FROM tool_permissions WHERE gateway_id = $1 AND seq > 0", gateway_id
    )
    return None if row is None else Current(int(row["seq"]), row["jws"])


async def gateways_with_mcp(conn: asyncpg.Connection) -> list[str]:
    """Gateways that need permissions kept fresh: an MCP route deployed, or an artifact held."""
    rows = await conn.fetch(
        "SELECT d.gateway_id FROM deployments d JOIN apis a ON a.api_id = d.api_id WHERE a.kind = 'mcp'"
        " UNION SELECT gateway_id FROM tool_permissions WHERE seq > 0 ORDER BY 1"
    )
    return [row["gateway_id"] for row in rows]
