"""Trusted issuers: creation, JWKS refresh (on demand and periodic), deletion; each change bumps every
gateway where the tenant has a route, in the same transaction."""

from __future__ import annotations

import asyncio
import logging
import secrets

import asyncpg

from stoa_cp import jwks
from stoa_cp.problems import Problem, conflict, not_found
from stoa_cp.publish import bump, lock_tenant, require_tenant, tenant_gateways
from stoa_cp.schemas import IssuerIn

log = logging.getLogger("stoa_cp")

FIELDS = "issuer_id, tenant_id, issuer, jwks_uri, jwks, fetched_at, last_error"
SELECT = f"SELECT {FIELDS} FROM issuers"  # noqa: S608 - constant text, no input


async def create(
    pool: asyncpg.Pool, tenant_id: str, body: IssuerIn, fetch_timeout_s: float
) -> asyncpg.Record:
    if (body.jwks_uri is None) == (body.jwks is None):
        raise Problem(422, "Validation failed", [("jwks_uri", "give exactly one of jwks_uri or jwks")])
    await require_tenant(pool, tenant_id)
    try:
        # Fetched before any lock is taken: a slow identity provider never holds up other writers.
        keys = (
            jwks.check(body.jwks, "jwks")
            if body.jwks is not None
            else await jwks.fetch(str(body.jwks_uri), fetch_timeout_s)
        )
    except jwks.JwksError as exc:
        raise exc.problem() from None
    async with pool.acquire() as conn, conn.transaction():
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


async def refresh(pool: asyncpg.Pool, issuer_id: str, fetch_timeout_s: float) -> tuple[asyncpg.Record, bool]:
    """Re-fetch the issuer's jwks_uri; store and publish the keys when they changed."""
    current = await pool.fetchrow(SELECT + " WHERE issuer_id = $1", issuer_id)
    if current is None:
        raise not_found("issuer_id", issuer_id)
    uri = current["jwks_uri"]
    if uri is None:
        raise Problem(
            409, "Conflict", [("jwks_uri", "this issuer has inline keys and no jwks_uri to refresh")]
        )
    try:
        keys = await jwks.fetch(uri, fetch_timeout_s)
    except jwks.JwksError as exc:
        await pool.execute("UPDATE issuers SET last_error = $2 WHERE issuer_id = $1", issuer_id, exc.message)
        # The identity provider failed, not the caller: the previous keys stay in force.
        raise exc.problem(status=502) from None
    async with pool.acquire() as conn, conn.transaction():
        await lock_tenant(conn, current["tenant_id"], "update")
        stored = await conn.fetchrow(
            "SELECT jwks FROM issuers WHERE issuer_id = $1 AND jwks_uri = $2 FOR UPDATE", issuer_id, uri
        )
        if stored is None:
            raise not_found("issuer_id", issuer_id)
        changed = stored["jwks"] != keys
        if changed:
            await bump(conn, await tenant_gateways(conn, current["tenant_id"]))
        row = await conn.fetchrow(
            "UPDATE issuers SET jwks = $2, fetched_at = now(), last_error = '' WHERE issuer_id = $1"  # noqa: S608
            f" RETURNING {FIELDS}",
            issuer_id,
            keys,
        )
    assert row is not None
    return row, changed


async def delete(pool: asyncpg.Pool, tenant_id: str, issuer_id: str) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await lock_tenant(conn, tenant_id, "update")
        deleted = await conn.fetchval(
            "DELETE FROM issuers WHERE issuer_id = $1 AND tenant_id = $2 RETURNING 1", issuer_id, tenant_id
        )
        if deleted is None:
            raise not_found("issuer_id", issuer_id)
        await bump(conn, await tenant_gateways(conn, tenant_id))


async def refresh_forever(pool: asyncpg.Pool, interval_s: float, fetch_timeout_s: float) -> None:
    """Background refresh of every jwks_uri; a failing provider keeps its last good keys."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            ids = [
                r["issuer_id"]
                for r in await pool.fetch("SELECT issuer_id FROM issuers WHERE jwks_uri IS NOT NULL")
            ]
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning("JWKS refresh skipped: database unavailable (%s)", exc)
            continue
        for issuer_id in ids:
            try:
                _, changed = await refresh(pool, issuer_id, fetch_timeout_s)
                if changed:
                    log.info("JWKS of issuer %s changed; affected gateways bumped", issuer_id)
            except Problem as exc:
                log.warning("JWKS refresh of issuer %s failed: %s", issuer_id, exc.detail)
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("JWKS refresh of issuer %s failed: %s", issuer_id, exc)
