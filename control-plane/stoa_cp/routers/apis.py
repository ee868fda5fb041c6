"""APIs of a tenant (reach: `store.apis`)."""

from __future__ import annotations

from fastapi import APIRouter

from stoa_cp.access import TenantScope
from stoa_cp.problems import PROBLEM_RESPONSES
from stoa_cp.routers.tenant_objects import Resource, mount
from stoa_cp.schemas import ApiIn, ApiOut, ApiUpdate
from stoa_cp.store import apis

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/apis",
    tags=["apis"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)
mount(
    router,
    Resource(
        collection="",
        key="api_id",
        singular="api",
        plural="apis",
        out=ApiOut,
        store=apis,
        create_body=ApiIn,
        update_body=ApiUpdate,
        repeatable=True,
        docs={
            "delete": "Delete the API; every gateway it was deployed on gets a tombstone and a new"
            " generation."
        },
    ),
)
