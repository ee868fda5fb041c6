"""Plans of a tenant (reach: `store.plans`)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from stoa_cp.access import TenantScope
from stoa_cp.dependencies import Db, ExistingTenant
from stoa_cp.problems import PROBLEM_RESPONSES
from stoa_cp.schemas import PlanIn, PlanOut, PlanUpdate
from stoa_cp.store import plans

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/plans",
    tags=["plans"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)


@router.post("", status_code=201)
async def create_plan(tenant_id: str, body: PlanIn, db: Db) -> PlanOut:
    return await plans.create(db, tenant_id, body)


@router.get("")
async def list_plans(tenant_id: ExistingTenant, db: Db) -> list[PlanOut]:
    return await plans.list_for(db, tenant_id)


@router.get("/{plan_id}")
async def get_plan(tenant_id: ExistingTenant, plan_id: str, db: Db) -> PlanOut:
    return await plans.get(db, tenant_id, plan_id)


@router.put("/{plan_id}")
async def update_plan(tenant_id: str, plan_id: str, body: PlanUpdate, db: Db) -> PlanOut:
    return await plans.update(db, tenant_id, plan_id, body)


@router.delete("/{plan_id}", status_code=204)
async def delete_plan(tenant_id: str, plan_id: str, db: Db) -> Response:
    """Delete an unused plan (409 naming a subscription that uses it)."""
    await plans.delete(db, tenant_id, plan_id)
    return Response(status_code=204)
