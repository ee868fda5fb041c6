"""Trusted issuers: creation, JWKS refresh (on demand and periodic), deletion. Keys are fetched before
any lock is taken, so a slow identity provider never holds up other writers."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from stoa_cp import jwks
from stoa_cp.problems import Problem, not_found
from stoa_cp.schemas import IssuerIn, IssuerOut
from stoa_cp.store import issuers, tenants
from stoa_cp.store.database import Database
from stoa_cp.store.tenant_objects import Objects, Services

log = logging.getLogger("stoa_cp")


async def create(
    db: Database, tenant_id: str, body: IssuerIn, fetch_timeout_s: float
) -> tuple[asyncpg.Record, bool]:
    """Trust an issuer: inline keys are checked, a jwks_uri is fetched now; failure stores nothing."""
    if (body.jwks_uri is None) == (body.jwks is None):
        raise Problem(422, "Validation failed", [("jwks_uri", "give exactly one of jwks_uri or jwks")])
    if not await tenants.exists(db, tenant_id):
        raise not_found("tenant_id", tenant_id)
    try:
        if body.jwks is not None:
            keys = jwks.check(body.jwks, "jwks")
        else:
            try:
                keys = await jwks.fetch(str(body.jwks_uri), fetch_timeout_s)
            except jwks.JwksError as exc:
                # The identity provider failed (down, or no usable key set there), not the caller.
                raise exc.problem(status=502) from None
    except jwks.JwksError as exc:
        raise exc.problem() from None
    return await issuers.create(db, tenant_id, body, keys)


class Issuers(Objects[IssuerOut]):
    """The issuers' operations for their router: creating one fetches its keys first."""

    async def create(
        self, db: Database, services: Services, owner_id: str, body: IssuerIn
    ) -> tuple[IssuerOut, bool]:
        row, created = await create(db, owner_id, body, services.settings.jwks_fetch_timeout_s)
        return IssuerOut.of(row), created


objects = Issuers(issuers.KIND)


async def refresh(db: Database, issuer_id: str, fetch_timeout_s: float) -> tuple[asyncpg.Record, bool]:
    """Re-fetch the issuer's jwks_uri; store and publish the keys when they changed."""
    current = await issuers.get(db, issuer_id)
    uri = current["jwks_uri"]
    if uri is None:
        raise Problem(
            409, "Conflict", [("jwks_uri", "this issuer has inline keys and no jwks_uri to refresh")]
        )
    try:
        keys = await jwks.fetch(uri, fetch_timeout_s)
    except jwks.JwksError as exc:
        await issuers.record_error(db, issuer_id, exc.message)
        # The identity provider failed, not the caller: the previous keys stay in force.
        raise exc.problem(status=502) from None
    return await issuers.adopt_keys(db, current["tenant_id"], issuer_id, uri, keys)


async def refresh_forever(
    db: Database, interval_s: float, fetch_timeout_s: float, stale_after_s: float
) -> None:
    """Background refresh of every jwks_uri; a failing provider keeps its last good keys until they are
    `stale_after_s` old, then they leave the inventories (a site keeps serving through a CP outage, but
    not on keys its identity provider stopped vouching for long ago)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            ids = await issuers.with_jwks_uri(db)
        except Problem as exc:
            log.warning("JWKS refresh skipped: %s", exc.detail)
            continue
        for issuer_id in ids:
            try:
                _, changed = await refresh(db, issuer_id, fetch_timeout_s)
                if changed:
                    log.info("JWKS of issuer %s changed; affected gateways bumped", issuer_id)
            except Problem as exc:
                log.warning("JWKS refresh of issuer %s failed: %s", issuer_id, exc.detail)
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("JWKS refresh of issuer %s failed: %s", issuer_id, exc)
        try:
            for issuer_id in await issuers.mark_stale(db, stale_after_s):
                log.warning(
                    "issuer_stale issuer=%s: no fetch adopted for %.0fs; its keys leave the inventories",
                    issuer_id,
                    stale_after_s,
                )
        except Problem as exc:
            log.warning("stale issuer check skipped: %s", exc.detail)
