"""Plans of a tenant (reach: `store.plans`)."""

from __future__ import annotations

from fastapi import APIRouter

from stoa_cp.access import TenantScope
from stoa_cp.problems import PROBLEM_RESPONSES
from stoa_cp.routers.tenant_objects import Resource, mount
from stoa_cp.schemas import PlanIn, PlanOut, PlanUpdate
from stoa_cp.store import plans

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/plans",
    tags=["plans"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)
mount(
    router,
    Resource(
        collection="",
        key="plan_id",
        singular="plan",
        plural="plans",
        out=PlanOut,
        store=plans.objects,
        create_body=PlanIn,
        update_body=PlanUpdate,
        docs={"delete": "Delete an unused plan (409 naming a subscription that uses it)."},
    ),
)
