"""Subscriptions of a tenant's consumers to its APIs (reach: `store.subscriptions`)."""

from __future__ import annotations

from stoa_cp.routers import tenant_objects
from stoa_cp.routers.tenant_objects import Resource
from stoa_cp.schemas import SubscriptionIn, SubscriptionUpdate
from stoa_cp.store import subscriptions

router = tenant_objects.router(
    "subscriptions",
    Resource(
        collection="/subscriptions",
        singular="subscription",
        plural="subscriptions",
        store=subscriptions.objects,
        create_body=SubscriptionIn,
        update_body=SubscriptionUpdate,
        docs={"update": "Suspend or reactivate: a suspended subscription is refused at every site (403)."},
    ),
)
