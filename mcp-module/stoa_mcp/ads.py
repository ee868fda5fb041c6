"""The MCP module's resources over the Link's ADS, on one stream: the tool registry (McpPolicySet) and
the signed tool permissions (ToolPermissions). A refused registry or artifact is NACKed with the reason
and what is in force stays.

The stream itself (delta or state of the world, ACK/NACK like Envoy, reconnects with backoff) is
`stoa_ops.policy_sets`, shared with the authorization and processing services.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc
from stoa_ops.policy_sets import PolicySubscription, ResourceSet, the_resource
from stoa_proto import mcp_pb2

from stoa_mcp.permissions import Permissions
from stoa_mcp.registry import Registry, compile_policy_set

POLICY_SET_TYPE = "type.googleapis.com/stoa.mcp.v1.McpPolicySet"
PERMISSIONS_TYPE = "type.googleapis.com/stoa.mcp.v1.ToolPermissions"


def subscribe(
    address: str,
    permissions: Permissions,
    on_registry: Callable[[Registry], None],
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str = "",
    delta: bool = True,
) -> PolicySubscription:
    async def registry(offered: ResourceSet) -> Mapping[str, object]:
        compiled = compile_policy_set(the_resource(offered, POLICY_SET_TYPE, mcp_pb2.McpPolicySet))
        on_registry(compiled)
        return {"version": compiled.version, "routes": len(compiled.routes), "tools": len(compiled.tools)}

    async def artifact(offered: ResourceSet) -> Mapping[str, object]:
        resource = the_resource(offered, PERMISSIONS_TYPE, mcp_pb2.ToolPermissions)
        offered = permissions.offer(resource.jws)
        return {"seq": offered.claims.seq, "kid": offered.kid, "expires_at": offered.claims.exp}

    return PolicySubscription(
        address,
        service="stoa-mcp",
        resources={POLICY_SET_TYPE: registry, PERMISSIONS_TYPE: artifact},
        credentials=credentials,
        server_name=server_name,
        delta=delta,
    )
