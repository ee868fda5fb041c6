"""Policies: tenant/api-scoped under a tenant, gateway-scoped under a gateway (reach: `store.policies`)."""

from __future__ import annotations

from fastapi import APIRouter

from stoa_cp.access import PlatformScope, TenantScope
from stoa_cp.problems import PROBLEM_RESPONSES
from stoa_cp.routers.tenant_objects import GATEWAY, Resource, mount
from stoa_cp.schemas import (
    GatewayPolicyBody,
    GatewayPolicyPut,
    PolicyOut,
    TenantPolicyBody,
    TenantPolicyPut,
)
from stoa_cp.store import policies

tenant_router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/policies",
    tags=["policies"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)
gateway_router = APIRouter(
    prefix="/v1/gateways/{gateway_id}/policies",
    tags=["policies"],
    dependencies=[PlatformScope],
    responses=PROBLEM_RESPONSES,
)
_REPLACES = {"update": "PUT replaces the policy; the id is the path's."}
mount(
    tenant_router,
    Resource(
        collection="",
        key="policy_id",
        singular="tenant_policy",
        plural="tenant_policies",
        out=PolicyOut,
        store=policies.tenant_policies,
        create_body=TenantPolicyBody,
        update_body=TenantPolicyPut,
        repeatable=True,
        docs=_REPLACES,
    ),
)
mount(
    gateway_router,
    Resource(
        collection="",
        key="policy_id",
        singular="gateway_policy",
        plural="gateway_policies",
        out=PolicyOut,
        store=policies.gateway_policies,
        create_body=GatewayPolicyBody,
        update_body=GatewayPolicyPut,
        owner=GATEWAY,
        repeatable=True,
        docs=_REPLACES,
    ),
)
