"""Consumers of a tenant and their API keys (reach: `store.consumers`, `store.api_keys`)."""

from __future__ import annotations

from fastapi import Response

from stoa_cp.dependencies import Db, ExistingTenant
from stoa_cp.routers import tenant_objects
from stoa_cp.routers.tenant_objects import Resource
from stoa_cp.schemas import ConsumerIn, ConsumerUpdate, KeyCreated, KeyOut
from stoa_cp.store import api_keys, consumers

router = tenant_objects.router(
    "consumers",
    Resource(
        collection="/consumers",
        singular="consumer",
        plural="consumers",
        store=consumers.objects,
        create_body=ConsumerIn,
        update_body=ConsumerUpdate,
        docs={"delete": "Delete the consumer and its subscriptions; its keys are revoked."},
    ),
)


@router.post("/consumers/{consumer_id}/keys", status_code=201)
async def create_key(tenant_id: str, consumer_id: str, db: Db) -> KeyCreated:
    """A new key, shown in this answer only; the CP keeps its SHA-256 and its public prefix."""
    return await api_keys.create(db, tenant_id, consumer_id)


@router.get("/consumers/{consumer_id}/keys")
async def list_keys(tenant_id: ExistingTenant, consumer_id: str, db: Db) -> list[KeyOut]:
    return await api_keys.list_for(db, tenant_id, consumer_id)


@router.delete("/consumers/{consumer_id}/keys/{key_id}", status_code=204)
async def revoke_key(tenant_id: str, consumer_id: str, key_id: str, db: Db) -> Response:
    """Revoke the key: refused at every site from the next generation on, never rolled back."""
    await api_keys.revoke(db, tenant_id, consumer_id, key_id)
    return Response(status_code=204)
