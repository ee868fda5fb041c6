from __future__ import annotations

from fastapi import APIRouter, Response

from stoa_cp.access import AnyCaller, Caller, PlatformScope
from stoa_cp.dependencies import Db
from stoa_cp.problems import PROBLEM_RESPONSES, REPEATED_CREATE, answered
from stoa_cp.schemas import TenantIn, TenantOut
from stoa_cp.store import tenants

router = APIRouter(
    prefix="/v1/tenants", tags=["tenants"], dependencies=[AnyCaller], responses=PROBLEM_RESPONSES
)


@router.post("", status_code=201, dependencies=[PlatformScope], responses=REPEATED_CREATE)
async def create_tenant(body: TenantIn, db: Db, response: Response) -> TenantOut:
    tenant, created = await tenants.create(db, body)
    return answered(response, tenant, created)


@router.get("")
async def list_tenants(db: Db, principal: Caller) -> list[TenantOut]:
    """Every tenant for a platform-wide caller; a tenant-bound caller sees only its own."""
    return await tenants.list_all(db, only=principal.tenant)
