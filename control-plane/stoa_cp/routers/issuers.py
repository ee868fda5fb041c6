from __future__ import annotations

from fastapi import APIRouter, Request, Response

from stoa_cp import trust
from stoa_cp.access import TenantScope
from stoa_cp.dependencies import Db, ExistingTenant
from stoa_cp.problems import PROBLEM_RESPONSES, REPEATED_CREATE, answered, not_found, problem_responses
from stoa_cp.schemas import IssuerIn, IssuerOut, IssuerRefreshed
from stoa_cp.store import issuers

_UPSTREAM = problem_responses(
    (502, "The issuer's jwks_uri could not be fetched or holds no usable key set (nothing is changed)")
)

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/issuers",
    tags=["issuers"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)


@router.post("", status_code=201, responses={**REPEATED_CREATE, **_UPSTREAM})
async def create_issuer(
    tenant_id: str, body: IssuerIn, request: Request, db: Db, response: Response
) -> IssuerOut:
    """Trust an issuer for the tenant. A jwks_uri is fetched now (bounded timeout); failure stores nothing."""
    row, created = await trust.create(db, tenant_id, body, request.app.state.settings.jwks_fetch_timeout_s)
    return answered(response, IssuerOut.of(row), created)


@router.get("")
async def list_issuers(tenant_id: ExistingTenant, db: Db) -> list[IssuerOut]:
    return [IssuerOut.of(row) for row in await issuers.list_for(db, tenant_id)]


@router.delete("/{issuer_id}", status_code=204)
async def delete_issuer(tenant_id: str, issuer_id: str, db: Db) -> Response:
    await issuers.delete(db, tenant_id, issuer_id)
    return Response(status_code=204)


@router.post("/{issuer_id}/refresh", responses=_UPSTREAM)
async def refresh_issuer(tenant_id: str, issuer_id: str, request: Request, db: Db) -> IssuerRefreshed:
    """Re-fetch the jwks_uri now; changed keys bump every gateway where the tenant has a route."""
    if (await issuers.get(db, issuer_id))["tenant_id"] != tenant_id:
        raise not_found("issuer_id", issuer_id)
    row, changed = await trust.refresh(db, issuer_id, request.app.state.settings.jwks_fetch_timeout_s)
    return IssuerRefreshed(**IssuerOut.of(row).model_dump(), changed=changed)
