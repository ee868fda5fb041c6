from __future__ import annotations

from fastapi import APIRouter, Response

from stoa_cp.access import AnyCaller, ApiScope, Caller, PlatformScope
from stoa_cp.auth import new_credential
from stoa_cp.dependencies import Db, ExistingGateway
from stoa_cp.problems import PROBLEM_RESPONSES, REPEATED_CREATE, answered
from stoa_cp.schemas import DeploymentOut, GatewayCreated, GatewayIn, GatewayOut, GatewayStatus
from stoa_cp.store import deployments, gateways

router = APIRouter(
    prefix="/v1/gateways", tags=["gateways"], dependencies=[AnyCaller], responses=PROBLEM_RESPONSES
)


@router.post("", status_code=201, dependencies=[PlatformScope], responses=REPEATED_CREATE)
async def create_gateway(body: GatewayIn, db: Db, response: Response) -> GatewayCreated:
    """Register a gateway at generation 1; the credential is returned once and stored only hashed."""
    credential, credential_digest = new_credential()
    gateway, created = await gateways.create(db, body, credential, credential_digest)
    return answered(response, gateway, created)


@router.get("")
async def list_gateways(db: Db) -> list[GatewayOut]:
    return await gateways.list_all(db)


@router.get("/{gateway_id}")
async def get_gateway(gateway_id: str, db: Db) -> GatewayOut:
    return await gateways.get(db, gateway_id)


@router.get("/{gateway_id}/deployments")
async def list_deployments(gateway_id: ExistingGateway, db: Db, principal: Caller) -> list[str]:
    """The APIs deployed on the gateway (a tenant-bound caller's own only)."""
    return await deployments.list_for(db, gateway_id, principal.tenant)


@router.put("/{gateway_id}/deployments/{api_id}", dependencies=[ApiScope])
async def deploy(gateway_id: str, api_id: str, db: Db) -> DeploymentOut:
    """Activate an API on a gateway (idempotent: deploying a deployed API changes nothing)."""
    return await deployments.deploy(db, gateway_id, api_id)


@router.delete("/{gateway_id}/deployments/{api_id}", dependencies=[ApiScope])
async def undeploy(gateway_id: str, api_id: str, db: Db) -> DeploymentOut:
    """Deactivate an API on a gateway: the route leaves through a tombstone in a new generation."""
    return await deployments.undeploy(db, gateway_id, api_id)


@router.get("/{gateway_id}/status")
async def gateway_status(gateway_id: str, db: Db, principal: Caller) -> GatewayStatus:
    """Sync state, always about the desired generation: a report for an older one never makes it SYNCED.

    The gateway-wide detail is platform-level: a tenant-bound caller gets the state, the report's
    reason without Envoy's text (which may name any tenant's routes) and only its own invalid policies."""
    status = await gateways.status(db, gateway_id)
    if principal.tenant is not None:
        if status.last_report is not None:
            status.last_report.detail = ""
        status.invalid_policies = [p for p in status.invalid_policies if p.tenant_id == principal.tenant]
    return status
