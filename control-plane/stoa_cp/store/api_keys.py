"""API keys of a consumer. A key is shown once, at creation; the store keeps its SHA-256 and a public
prefix. Revoking keeps the row: every inventory lists the tenant's revoked digests, so revocations
only ever grow at a site."""

from __future__ import annotations

import hashlib
import secrets

import asyncpg

from stoa_cp.problems import not_found
from stoa_cp.schemas import KeyCreated, KeyOut
from stoa_cp.store import consumers
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_tenant, tenant_gateways

KEY_SCHEME = "stoa"


def new_key() -> tuple[str, str]:
    """(public prefix, key): `stoa_<prefix>_<secret>`, 256 random bits behind a 48-bit public prefix."""
    prefix = secrets.token_hex(6)
    return prefix, f"{KEY_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


async def create(db: Database, tenant_id: str, consumer_id: str) -> KeyCreated:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        if (
            await conn.fetchval(
                "SELECT 1 FROM consumers WHERE tenant_id = $1 AND consumer_id = $2 FOR SHARE",
                tenant_id,
                consumer_id,
            )
            is None
        ):
            raise not_found("consumer_id", consumer_id)
        prefix, key = new_key()
        key_id = f"key-{prefix}"
        created_at = await conn.fetchval(
            "INSERT INTO api_keys (key_id, tenant_id, consumer_id, prefix, key_sha256)"
            " VALUES ($1, $2, $3, $4, $5) RETURNING created_at",
            key_id,
            tenant_id,
            consumer_id,
            prefix,
            digest(key),
        )
        await bump(conn, await tenant_gateways(conn, tenant_id))
    return KeyCreated(key_id=key_id, consumer_id=consumer_id, prefix=prefix, key=key, created_at=created_at)


def _out(row: asyncpg.Record) -> KeyOut:
    return KeyOut(**dict(row))


async def list_for(db: Database, tenant_id: str, consumer_id: str) -> list[KeyOut]:
    await consumers.objects.get(db, tenant_id, consumer_id)
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT key_id, consumer_id, prefix, created_at, revoked_at FROM api_keys"
            " WHERE tenant_id = $1 AND consumer_id = $2 ORDER BY created_at, key_id",
            tenant_id,
            consumer_id,
        )
    return [_out(row) for row in rows]


async def revoke(db: Database, tenant_id: str, consumer_id: str, key_id: str) -> None:
    """Revoke the key (404 when unknown or already revoked)."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        revoked = await conn.fetchval(
            "UPDATE api_keys SET revoked_at = now()"
            " WHERE tenant_id = $1 AND consumer_id = $2 AND key_id = $3 AND revoked_at IS NULL RETURNING 1",
            tenant_id,
            consumer_id,
            key_id,
        )
        if revoked is None:
            raise not_found("key_id", key_id)
        await bump(conn, await tenant_gateways(conn, tenant_id))
