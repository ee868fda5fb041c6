"""Trusted issuers of a tenant and the keys the CP ships to sites. Each change of keys is a new
generation of every gateway where the tenant has a route."""

from __future__ import annotations

import secrets
from typing import Any

import asyncpg

from stoa_cp.problems import conflict, not_found
from stoa_cp.schemas import IssuerIn, IssuerOut
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_tenant, tenant_gateways
from stoa_cp.store.tenant_objects import Kind

FIELDS = "issuer_id, tenant_id, issuer, jwks_uri, jwks, fetched_at, last_error, stale"
_SELECT = f"SELECT {FIELDS} FROM issuers"  # noqa: S608 - constant text, no input

# Listing and deleting; creating (keys fetched first) and refreshing are `stoa_cp.trust`'s.
KIND = Kind(
    table="issuers",
    key="issuer_id",
    columns=("issuer", "jwks_uri", "jwks", "fetched_at", "last_error", "stale"),
    model=IssuerOut,
    out=IssuerOut.of,
    order="issuer",
    repeatable=True,  # the same issuer with the same source of keys is answered as it is
)


async def create(
    db: Database, tenant_id: str, body: IssuerIn, keys: dict[str, Any]
) -> tuple[asyncpg.Record, bool]:
    """The issuer, and whether this call created it: the same issuer with the same jwks_uri (or the
    same inline keys) is answered as it is; with another source of keys it is a 409."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        existing = await conn.fetchrow(
            _SELECT + " WHERE tenant_id = $1 AND issuer = $2", tenant_id, body.issuer
        )
        if existing is not None:
            same_source = (
                existing["jwks_uri"] == body.jwks_uri
                if body.jwks_uri is not None
                else existing["jwks_uri"] is None and existing["jwks"] == keys
            )
            if not same_source:
                raise conflict("issuer", body.issuer)
            return existing, False
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
    return row, True


async def get(db: Database, issuer_id: str) -> asyncpg.Record:
    async with db.connection() as conn:
        row = await conn.fetchrow(_SELECT + " WHERE issuer_id = $1", issuer_id)
    if row is None:
        raise not_found("issuer_id", issuer_id)
    return row


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
            "SELECT jwks, stale FROM issuers WHERE issuer_id = $1 AND jwks_uri = $2 FOR UPDATE",
            issuer_id,
            uri,
        )
        if stored is None:
            raise not_found("issuer_id", issuer_id)
        # A stale issuer's keys were out of the inventories: adopting them again is a change too.
        changed = stored["jwks"] != keys or stored["stale"]
        if changed:
            await bump(conn, await tenant_gateways(conn, tenant_id))
        row = await conn.fetchrow(
            "UPDATE issuers SET jwks = $2, fetched_at = now(), last_error = '', stale = false"  # noqa: S608
            f" WHERE issuer_id = $1 RETURNING {FIELDS}",
            issuer_id,
            keys,
        )
    assert row is not None
    return row, changed


_PAST_BOUND = "jwks_uri IS NOT NULL AND NOT stale AND fetched_at < now() - make_interval(secs => $1)"


async def mark_stale(db: Database, stale_after_s: float) -> list[str]:
    """Issuers whose last adopted fetch is older than `stale_after_s` become stale: their keys leave
    every inventory (a new generation of each gateway where the tenant has a route). Their ids."""
    async with db.connection() as conn:
        candidates = await conn.fetch(
            f"SELECT issuer_id, tenant_id FROM issuers WHERE {_PAST_BOUND}",  # noqa: S608
            stale_after_s,
        )
    marked = []
    for row in candidates:
        async with db.transaction() as conn:
            await lock_tenant(conn, row["tenant_id"], "update")
            done = await conn.fetchval(
                f"UPDATE issuers SET stale = true WHERE issuer_id = $2 AND {_PAST_BOUND} RETURNING 1",  # noqa: S608
                stale_after_s,
                row["issuer_id"],
            )
            if done is not None:
                await bump(conn, await tenant_gateways(conn, row["tenant_id"]))
                marked.append(row["issuer_id"])
    return marked


async def count_stale(db: Database) -> int:
    async with db.connection() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM issuers WHERE stale"))
