from __future__ import annotations

from fastapi import APIRouter

from stoa_cp.auth import AdminCredential
from stoa_cp.dependencies import Db
from stoa_cp.problems import PROBLEM_RESPONSES
from stoa_cp.schemas import TenantIn, TenantOut
from stoa_cp.store import tenants

router = APIRouter(
    prefix="/v1/tenants", tags=["tenants"], dependencies=[AdminCredential], responses=PROBLEM_RESPONSES
)


@router.post("", status_code=201)
async def create_tenant(body: TenantIn, db: Db) -> TenantOut:
    return await tenants.create(db, body)


@router.get("")
async def list_tenants(db: Db) -> list[TenantOut]:
    return await tenants.list_all(db)
