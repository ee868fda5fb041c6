"""The tool registry the Link serves (McpPolicySet): the MCP routes of the gateway and the tools of
their tenants, compiled once per policy set (argument validators, the MCP tool descriptions)."""

from __future__ import annotations

from dataclasses import dataclass, field

import mcp_types as types
from jsonschema import Draft202012Validator
from stoa_ops.policy_sets import Refused
from stoa_proto import mcp_pb2
from stoa_translate import tools as tool_rules


class RegistryError(Refused):
    """A policy set the module cannot use (NACKed with this message; the one in force stays)."""


@dataclass(frozen=True)
class CompiledTool:
    """A tool as the registry carries it (`spec`: its API's method, path and upstream, its timeout and
    budget), with what is compiled once per policy set: its argument and answer validators and its
    MCP description."""

    spec: mcp_pb2.Tool
    input_validator: Draft202012Validator
    output_validator: Draft202012Validator | None
    description: types.Tool

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def budget(self) -> tuple[int, int] | None:
        """Calls per window per consumer; None: no budget."""
        return (self.spec.budget_calls, self.spec.budget_window_s) if self.spec.budget_calls else None


@dataclass(frozen=True)
class Registry:
    version: str = ""
    # api_id → tenant of each MCP route.
    routes: dict[str, str] = field(default_factory=dict)
    # (tenant, name) → tool.
    tools: dict[tuple[str, str], CompiledTool] = field(default_factory=dict)

    def tenant_tools(self, tenant_id: str) -> list[CompiledTool]:
        return [tool for (tenant, _), tool in sorted(self.tools.items()) if tenant == tenant_id]


def compile_policy_set(policy_set: mcp_pb2.McpPolicySet) -> Registry:
    routes = {route.api_id: route.tenant_id for route in policy_set.routes}
    tools: dict[tuple[str, str], CompiledTool] = {}
    for tool in policy_set.tools:
        where = f"tool {tool.tenant_id}/{tool.name}"
        if (tool.tenant_id, tool.name) in tools:
            raise RegistryError(f"{where}: duplicate")
        try:
            # The rules the CP and the Link apply to the same tool.
            documents = tool_rules.read(tool)
            description = types.Tool(
                name=tool.name,
                description=tool.description,
                input_schema=documents.input_schema,
                output_schema=documents.output_schema,
                annotations=types.ToolAnnotations(**documents.annotations) if documents.annotations else None,
            )
        except (ValueError, TypeError) as exc:
            raise RegistryError(f"{where}: {exc}") from None
        output_schema = documents.output_schema
        tools[(tool.tenant_id, tool.name)] = CompiledTool(
            tool,
            Draft202012Validator(documents.input_schema),
            Draft202012Validator(output_schema) if output_schema is not None else None,
            description,
        )
    return Registry(policy_set.version, routes, tools)
