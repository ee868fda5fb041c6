"""Plans of a tenant (reach: `store.plans`)."""

from __future__ import annotations

from stoa_cp.routers import tenant_objects
from stoa_cp.routers.tenant_objects import Resource
from stoa_cp.schemas import PlanIn, PlanUpdate
from stoa_cp.store import plans

router = tenant_objects.router(
    "plans",
    Resource(
        collection="/plans",
        singular="plan",
        plural="plans",
        store=plans.objects,
        create_body=PlanIn,
        update_body=PlanUpdate,
        docs={"delete": "Delete an unused plan (409 naming a subscription that uses it)."},
    ),
)
