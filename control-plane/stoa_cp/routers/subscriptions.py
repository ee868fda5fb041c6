"""Subscriptions of a tenant's consumers to its APIs (reach: `store.subscriptions`)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from stoa_cp.access import TenantScope
from stoa_cp.dependencies import Db, ExistingTenant
from stoa_cp.problems import PROBLEM_RESPONSES
from stoa_cp.schemas import SubscriptionIn, SubscriptionOut, SubscriptionUpdate
from stoa_cp.store import subscriptions

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/subscriptions",
    tags=["subscriptions"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)


@router.post("", status_code=201)
async def create_subscription(tenant_id: str, body: SubscriptionIn, db: Db) -> SubscriptionOut:
    return await subscriptions.create(db, tenant_id, body)


@router.get("")
async def list_subscriptions(tenant_id: ExistingTenant, db: Db) -> list[SubscriptionOut]:
    return await subscriptions.list_for(db, tenant_id)


@router.get("/{subscription_id}")
async def get_subscription(tenant_id: ExistingTenant, subscription_id: str, db: Db) -> SubscriptionOut:
    return await subscriptions.get(db, tenant_id, subscription_id)


@router.put("/{subscription_id}")
async def update_subscription(
    tenant_id: str, subscription_id: str, body: SubscriptionUpdate, db: Db
) -> SubscriptionOut:
    """Suspend or reactivate: a suspended subscription is refused at every site (403)."""
    return await subscriptions.set_state(db, tenant_id, subscription_id, body.state)


@router.delete("/{subscription_id}", status_code=204)
async def delete_subscription(tenant_id: str, subscription_id: str, db: Db) -> Response:
    await subscriptions.delete(db, tenant_id, subscription_id)
    return Response(status_code=204)
