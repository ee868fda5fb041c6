"""Trusted issuers of a tenant (keys fetched and refreshed: `stoa_cp.trust`)."""

from __future__ import annotations

from fastapi import Request

from stoa_cp import trust
from stoa_cp.dependencies import Db
from stoa_cp.problems import not_found, problem_responses
from stoa_cp.routers import tenant_objects
from stoa_cp.routers.tenant_objects import Resource
from stoa_cp.schemas import IssuerIn, IssuerOut, IssuerRefreshed
from stoa_cp.store import issuers

_UPSTREAM = problem_responses(
    (502, "The issuer's jwks_uri could not be fetched or holds no usable key set (nothing is changed)")
)

router = tenant_objects.router(
    "issuers",
    Resource(
        collection="/issuers",
        singular="issuer",
        plural="issuers",
        store=trust.objects,
        create_body=IssuerIn,
        get=False,
        create_responses=_UPSTREAM,
        docs={
            "create": "Trust an issuer for the tenant. A jwks_uri is fetched now (bounded timeout);"
            " failure stores nothing."
        },
    ),
)


@router.post("/issuers/{issuer_id}/refresh", responses=_UPSTREAM)
async def refresh_issuer(tenant_id: str, issuer_id: str, request: Request, db: Db) -> IssuerRefreshed:
    """Re-fetch the jwks_uri now; changed keys bump every gateway where the tenant has a route."""
    if (await issuers.get(db, issuer_id))["tenant_id"] != tenant_id:
        raise not_found("issuer_id", issuer_id)
    row, changed = await trust.refresh(db, issuer_id, request.app.state.settings.jwks_fetch_timeout_s)
    return IssuerRefreshed(**IssuerOut.of(row).model_dump(), changed=changed)
