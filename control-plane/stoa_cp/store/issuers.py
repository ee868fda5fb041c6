"""Trusted issuers of a tenant and the keys the CP ships to sites. Each change of keys is a new
generation of every gateway where the tenant has a route."""

from __future__ import annotations

import secrets
from typing import Any

import asyncpg

from stoa_cp.problems import conflict, not_found
from stoa_cp.schemas import IssuerIn
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_tenant, tenant_gateways

FIELDS = "issuer_id, tenant_id, issuer, jwks_uri, jwks, fetched_at, last_error"
_SELECT = f"SELECT {FIELDS} FROM issuers"  # noqa: S608 - constant text, no input


async def create(db: Database, tenant_id: str, body: IssuerIn, keys: dict[str, Any]) -> asyncpg.Record:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        try:
            row = await conn.fetchrow(
                "INSERT INTO issuers (issuer_id, tenant_id, issuer, jwks_uri, jwks, fetched_at)"  # noqa: S608
                " VALUES ($1, $2, $3, $4, $5, CASE WHEN $4::text IS NULL THEN NULL ELSE now() END)"
                f" RETURNING {FIELDS}",
                f"iss-{secrets.token_hex(8)}",
                tenant_id,
                body.issuer,
                body.jwks_uri,
                keys,
            )
        except asyncpg.UniqueViolationError:
            raise conflict("issuer", body.issuer) from None
        await bump(conn, await tenant_gateways(conn, tenant_id))
    assert row is not None
    return row


async def get(db: Database, issuer_id: str) -> asyncpg.Record:
    async with db.connection() as conn:
        row = await conn.fetchrow(_SELECT + " WHERE issuer_id = $1", issuer_id)
    if row is None:
        raise not_found("issuer_id", issuer_id)
    return row


async def list_for(db: Database, tenant_id: str) -> list[asyncpg.Record]:
    async with db.connection() as conn:
        return list(await conn.fetch(_SELECT + " WHERE tenant_id = $1 ORDER BY issuer", tenant_id))


async def with_jwks_uri(db: Database) -> list[str]:
    """Ids of the issuers whose keys are fetched from a jwks_uri."""
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT issuer_id FROM issuers WHERE jwks_uri IS NOT NULL ORDER BY issuer_id")
    return [row["issuer_id"] for row in rows]


async def record_error(db: Database, issuer_id: str, message: str) -> None:
    async with db.transaction() as conn:
        await conn.execute("UPDATE issuers SET last_error = $2 WHERE issuer_id = $1", issuer_id, message)


async def adopt_keys(
    db: Database, tenant_id: str, issuer_id: str, uri: str, keys: dict[str, Any]
) -> tuple[asyncpg.Record, bool]:
    """Store keys fetched from `uri` (still the issuer's jwks_uri); publish them when they changed."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        stored = await conn.fetchrow(
            "SELECT jwks FROM issuers WHERE issuer_id = $1 AND jwks_uri = $2 FOR UPDATE", issuer_id, uri
        )
        if stored is None:
            raise not_found("issuer_id", issuer_id)
        changed = stored["jwks"] != keys
        if changed:
            await bump(conn, await tenant_gateways(conn, tenant_id))
        row = await conn.fetchrow(
            "UPDATE issuers SET jwks = $2, fetched_at = now(), last_error = '' WHERE issuer_id = $1"  # noqa: S608
            f" RETURNING {FIELDS}",
            issuer_id,
            keys,
        )
    assert row is not None
    return row, changed


async def delete(db: Database, tenant_id: str, issuer_id: str) -> None:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        deleted = await conn.fetchval(
            "DELETE FROM issuers WHERE issuer_id = $1 AND tenant_id = $2 RETURNING 1", issuer_id, tenant_id
        )
        if deleted is None:
            raise not_found("issuer_id", issuer_id)
        await bump(conn, await tenant_gateways(conn, tenant_id))
