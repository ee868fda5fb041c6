"""The MCP server behind Envoy: streamable HTTP (the `mcp` SDK's low-level server and session
manager), one decision for every message of every stream of a session.

Each HTTP request is identified by its verified identity envelope (`identity`), which also names the
MCP route (its `api`) and so the tenant whose tools it sees. `tools/list` shows exactly the tools
`tools/call` would run for that caller; a tool the caller may not call, one of another tenant and one
that does not exist all answer the same "Unknown tool" error, so names do not leak. A session belongs
to the caller that opened it: another caller naming its id gets 404, as for an unknown session, and
so does everyone once the module no longer remembers who opened it.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import aiohttp
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import Message, Receive, Scope, Send
from stoa_proto.decisions import IDENTITY_HEADER

from stoa_mcp.budgets import Budgets, BudgetUnavailable
from stoa_mcp.call import error_result, invoke
from stoa_mcp.identity import EnvelopeVerifier, NotIdentified
from stoa_mcp.log import CallLog
from stoa_mcp.permissions import Caller, Permissions
from stoa_mcp.registry import CompiledTool, Registry

log = logging.getLogger("stoa_mcp.server")

CALLER = "stoa.caller"
ENVELOPE = "stoa.envelope"
SESSION_HEADER = b"mcp-session-id"
_IDENTITY = IDENTITY_HEADER.encode()
MAX_OWNERS = 10_000
# The caller of the HTTP request being answered, for what the SDK asks outside a handler's context.
_caller: ContextVar[Caller | None] = ContextVar("stoa_mcp_caller", default=None)


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


class McpModule:
    def __init__(
        self,
        permissions: Permissions,
        verifier: EnvelopeVerifier,
        http: aiohttp.ClientSession,
        upstream_timeout_ms: int,
        budgets: Budgets | None = None,
        security: TransportSecuritySettings | None = None,
    ) -> None:
        self.permissions = permissions
        self.verifier = verifier
        self.registry = Registry()
        self.registry_loaded = False
        self._http = http
        self._timeout_ms = upstream_timeout_ms
        self.budgets = budgets
        self.calls: Counter[str] = Counter()
        # Written by its flusher once started (`serve`); unstarted, lines wait in memory until close().
        self.call_log = CallLog()
        self.server: Server[Any] = Server(
            "stoa-mcp",
            version="0.1.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            get_tool_input_schema=self._input_schema,
        )
        # The SDK wraps every message in an OpenTelemetry span; no tracer is installed here, so the
        # spans go nowhere and only cost CPU per call (bench/PROFILE-mcp.md). Its documented opt-out.
        self.server.middleware.clear()
        self.sessions = StreamableHTTPSessionManager(
            app=self.server,
            session_idle_timeout=30 * 60,
            security_settings=security,
            # A POST is answered with its JSON result, not an event stream of one event: less work
            # per call (server-to-client streams are the GET stream).
            json_response=True,
        )
        # session id → the caller that opened it (tenant, MCP route, consumer); the oldest go first
        # past the session manager's own limit, whose idle sessions end by themselves.
        self._owners: OrderedDict[str, tuple[str, str, str]] = OrderedDict()

    def use_registry(self, registry: Registry) -> None:
        self.registry = registry
        self.registry_loaded = True

    def not_ready(self) -> str | None:
        """Why the module cannot enforce now (`no_artifact`, `artifact_expired`, `no_registry`), or None."""
        reason = self.permissions.not_enforceable()
        if reason is None and not self.registry_loaded:
            return "no_registry"
        return reason

    # ---- the one decision ----------------------------------------------------------------------

    def callable_tool(self, caller: Caller, name: str) -> CompiledTool | None:
        """The tool `name` if this caller may call it through its route, else None (for every reason)."""
        if self.registry.routes.get(caller.api_id) != caller.tenant_id:
            return None
        tool = self.registry.tools.get((caller.tenant_id, name))
        if tool is None or not self.permissions.allows(caller, name):
            return None
        return tool

    def visible_tools(self, caller: Caller) -> list[CompiledTool]:
        if self.registry.routes.get(caller.api_id) != caller.tenant_id:
            return []
        return [
            t for t in self.registry.tenant_tools(caller.tenant_id) if self.permissions.allows(caller, t.name)
        ]

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The input schema the SDK checks a call's `Mcp-Param-*` headers against: only of a tool this
        caller may call (as the listing would show it), else None (nothing to check: the call itself
        then answers "Unknown tool"). Without it, the SDK runs a whole tools/list for every call."""
        caller = _caller.get()
        tool = self.callable_tool(caller, name) if caller is not None else None
        return tool.description.input_schema if tool is not None else None

    # ---- MCP handlers --------------------------------------------------------------------------

    @staticmethod
    def _scope_value(ctx: ServerRequestContext[Any], key: str) -> Any:
        request = ctx.request
        value = request.scope.get(key) if request is not None else None  # type: ignore[attr-defined]
        if value is None:
            # Only requests that came through the identified HTTP path reach a handler.
            raise MCPError(types.INVALID_REQUEST, "not identified")
        return value

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        caller: Caller = self._scope_value(ctx, CALLER)
        return types.ListToolsResult(tools=[tool.description for tool in self.visible_tools(caller)])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller: Caller = self._scope_value(ctx, CALLER)
        envelope: str = self._scope_value(ctx, ENVELOPE)
        tool = self.callable_tool(caller, params.name)
        if tool is None:
            self.calls["unknown_tool"] += 1
            self.call_log.emit("unknown_tool", caller.tenant_id)
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        started = time.perf_counter()
        if tool.budget is not None:
            try:
                if self.budgets is None:
                    raise BudgetUnavailable("no quota store")
                retry_after = await self.budgets.spend(caller, tool.name, *tool.budget)
            except BudgetUnavailable:
                # Fail closed: a call that cannot be counted is not made.
                self._record("budget_unavailable", caller, tool.name, started)
                return error_result("the tool's budget cannot be counted now; try again later")
            if retry_after is not None:
                self._record("budget_exhausted", caller, tool.name, started)
                calls, window = tool.budget
                limit = f"{calls} calls per {window} s"
                return error_result(f"budget exhausted ({limit}); retry in {retry_after} s")
        result = await invoke(self._http, tool, dict(params.arguments or {}), envelope, self._timeout_ms)
        self._record("error" if result.is_error else "ok", caller, tool.name, started)
        return result

    def _record(self, outcome: str, caller: Caller, tool: str, started: float) -> None:
        """A call's outcome, counted and logged (the budget's refusals like any other)."""
        self.calls[outcome] += 1
        self.call_log.emit(outcome, caller.tenant_id, tool, (time.perf_counter() - started) * 1000)

    # ---- HTTP ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        envelope = headers.get(_IDENTITY, b"").decode("latin-1")
        try:
            caller = await self.verifier.caller(envelope)
        except NotIdentified as exc:
            log.warning("not_identified", extra={"why": str(exc)})
            await _json(send, 403, {"error": "not_identified"})
            return
        if self.registry.routes.get(caller.api_id) != caller.tenant_id:
            await _json(send, 404, {"error": "not_an_mcp_route"})
            return
        owner = (caller.tenant_id, caller.api_id, caller.consumer)
        session = headers.get(SESSION_HEADER, b"").decode("latin-1")
        # A session whose opener is not known (forgotten past the bound, or never opened here) is
        # refused like an unknown one: its caller opens a new session, and nobody else gets it.
        if session and self._owners.get(session) != owner:
            await _json(
                send,
                404,
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "Session not found"}},
            )
            return
        scope[CALLER] = caller
        scope[ENVELOPE] = envelope
        _caller.set(caller)

        async def record_owner(message: Message) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", []):
                    if name.lower() == SESSION_HEADER:
                        self._owners.setdefault(value.decode("latin-1"), owner)
                        while len(self._owners) > MAX_OWNERS:
                            self._owners.popitem(last=False)
            await send(message)

        await self.sessions.handle_request(scope, receive, record_owner)
        if scope["method"] == "DELETE" and session:
            self._owners.pop(session, None)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        async with self.sessions.run():
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})
