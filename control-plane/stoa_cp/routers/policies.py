"""Policies: tenant/api-scoped under a tenant, gateway-scoped under a gateway (reach: `store.policies`)."""

from __future__ import annotations

from stoa_cp.routers import tenant_objects
from stoa_cp.routers.tenant_objects import GATEWAY, Resource
from stoa_cp.schemas import (
    GatewayPolicyBody,
    GatewayPolicyPut,
    TenantPolicyBody,
    TenantPolicyPut,
)
from stoa_cp.store import policies

_REPLACES = {"update": "PUT replaces the policy; the id is the path's."}
tenant_router = tenant_objects.router(
    "policies",
    Resource(
        collection="/policies",
        singular="tenant_policy",
        plural="tenant_policies",
        store=policies.tenant_policies,
        create_body=TenantPolicyBody,
        update_body=TenantPolicyPut,
        docs=_REPLACES,
    ),
)
gateway_router = tenant_objects.router(
    "policies",
    Resource(
        collection="/policies",
        singular="gateway_policy",
        plural="gateway_policies",
        store=policies.gateway_policies,
        create_body=GatewayPolicyBody,
        update_body=GatewayPolicyPut,
        owner=GATEWAY,
        docs=_REPLACES,
    ),
)
