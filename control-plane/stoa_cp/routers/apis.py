"""APIs of a tenant (reach: `store.apis`)."""

from __future__ import annotations

from stoa_cp.routers import tenant_objects
from stoa_cp.routers.tenant_objects import Resource
from stoa_cp.schemas import ApiIn, ApiUpdate
from stoa_cp.store import apis

router = tenant_objects.router(
    "apis",
    Resource(
        collection="/apis",
        singular="api",
        plural="apis",
        store=apis,
        create_body=ApiIn,
        update_body=ApiUpdate,
        docs={
            "delete": "Delete the API; every gateway it was deployed on gets a tombstone and a new"
            " generation."
        },
    ),
)
