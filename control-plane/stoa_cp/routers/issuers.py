from __future__ import annotations

import asyncpg
from fastapi import APIRouter, Request, Response

from stoa_cp import trust
from stoa_cp.auth import Admin, Db
from stoa_cp.problems import PROBLEM_RESPONSES, not_found
from stoa_cp.publish import require_tenant
from stoa_cp.schemas import IssuerIn, IssuerOut, IssuerRefreshed

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/issuers",
    tags=["issuers"],
    dependencies=[Admin],
    responses=PROBLEM_RESPONSES,
)


def _out(row: asyncpg.Record) -> IssuerOut:
    return IssuerOut(**dict(row))


@router.post("", status_code=201)
async def create_issuer(tenant_id: str, body: IssuerIn, request: Request, db: Db) -> IssuerOut:
    """Trust an issuer for the tenant. A jwks_uri is fetched now (bounded timeout); failure stores nothing."""
    row = await trust.create(db, tenant_id, body, request.app.state.settings.jwks_fetch_timeout_s)
    return _out(row)


@router.get("")
async def list_issuers(tenant_id: str, db: Db) -> list[IssuerOut]:
    async with db.acquire() as conn:
        await require_tenant(conn, tenant_id)
        rows = await conn.fetch(trust.SELECT + " WHERE tenant_id = $1 ORDER BY issuer", tenant_id)
    return [_out(row) for row in rows]


@router.delete("/{issuer_id}", status_code=204)
async def delete_issuer(tenant_id: str, issuer_id: str, db: Db) -> Response:
    await trust.delete(db, tenant_id, issuer_id)
    return Response(status_code=204)


@router.post("/{issuer_id}/refresh")
async def refresh_issuer(tenant_id: str, issuer_id: str, request: Request, db: Db) -> IssuerRefreshed:
    """Re-fetch the jwks_uri now; changed keys bump every gateway where the tenant has a route."""
    owner = await db.fetchval("SELECT tenant_id FROM issuers WHERE issuer_id = $1", issuer_id)
    if owner != tenant_id:
        raise not_found("issuer_id", issuer_id)
    row, changed = await trust.refresh(db, issuer_id, request.app.state.settings.jwks_fetch_timeout_s)
    return IssuerRefreshed(**dict(row), changed=changed)
