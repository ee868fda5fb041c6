"""Subscriptions of a tenant's consumers to its APIs (reach: `store.subscriptions`)."""

from __future__ import annotations

from fastapi import APIRouter

from stoa_cp.access import TenantScope
from stoa_cp.problems import PROBLEM_RESPONSES
from stoa_cp.routers.tenant_objects import Resource, mount
from stoa_cp.schemas import SubscriptionIn, SubscriptionOut, SubscriptionUpdate
from stoa_cp.store import subscriptions

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/subscriptions",
    tags=["subscriptions"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)
mount(
    router,
    Resource(
        collection="",
        key="subscription_id",
        singular="subscription",
        plural="subscriptions",
        out=SubscriptionOut,
        store=subscriptions.objects,
        create_body=SubscriptionIn,
        update_body=SubscriptionUpdate,
        docs={"update": "Suspend or reactivate: a suspended subscription is refused at every site (403)."},
    ),
)
