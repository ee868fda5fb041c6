from __future__ import annotations

from fastapi import APIRouter, Request, Response

from stoa_cp.access import TenantScope
from stoa_cp.dependencies import Db, ExistingTenant
from stoa_cp.problems import PROBLEM_RESPONSES, REPEATED_CREATE, answered, invalid
from stoa_cp.schemas import ApiFields, ApiIn, ApiOut, ApiUpdate
from stoa_cp.store import apis

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/apis",
    tags=["apis"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)


@router.post("", status_code=201, responses=REPEATED_CREATE)
async def create_api(tenant_id: str, body: ApiIn, request: Request, db: Db, response: Response) -> ApiOut:
    _check_kind(body)
    max_routes = request.app.state.settings.max_routes_per_tenant
    api, created = await apis.create(db, tenant_id, body, max_routes)
    return answered(response, api, created)


@router.get("")
async def list_apis(tenant_id: ExistingTenant, db: Db) -> list[ApiOut]:
    return await apis.list_for(db, tenant_id)


@router.get("/{api_id}")
async def get_api(tenant_id: ExistingTenant, api_id: str, db: Db) -> ApiOut:
    return await apis.get(db, tenant_id, api_id)


@router.put("/{api_id}")
async def update_api(tenant_id: str, api_id: str, body: ApiUpdate, db: Db) -> ApiOut:
    _check_kind(body)
    return await apis.update(db, tenant_id, api_id, body)


@router.delete("/{api_id}", status_code=204)
async def delete_api(tenant_id: str, api_id: str, db: Db) -> Response:
    """Delete the API; every gateway it was deployed on gets a tombstone and a new generation."""
    await apis.delete(db, tenant_id, api_id)
    return Response(status_code=204)


def _check_kind(body: ApiFields) -> None:
    problem = body.kind_problem()
    if problem is not None:
        raise invalid(*problem)
