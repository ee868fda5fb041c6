"""The CP's HTTP API as the harness, its tests and its benchmarks call it: one client, two transports.

Every call is written once in `CPCalls` (method, path, body, what to return) and sent either by
`CPClient` (blocking, for the estate and the acceptance tests) or by `AsyncCPClient` (for code on an
event loop: the CP's own tests, which serve the CP on the test's loop, and the benchmark rig). Any
answer outside 2xx raises `CPError`, which carries the status and the problem body. The bearer token
is whatever the caller holds: an admin token, an OIDC access token, or a gateway's credential (for
`inventory`). `answer(method, path, ...)` sends any request with the same client and returns the
answer as it is, refusals included: for a test whose subject is the raw answer (status, headers,
problem body).

    with CPClient(cp_url, token, gateway_id="gw-1") as cp:
        cp.create_tenant("acme")
        cp.create_api("orders", tenant_id="acme", upstream_url="http://127.0.0.1:9000")
        cp.wait_synced(cp.deploy("orders"))         # deploy answers the gateway's new generation

    async with AsyncCPClient(cp_url, token) as cp:
        await cp.create_tenant("acme")
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx

from stoa_harness.wait import wait_until

R = TypeVar("R")

DEFAULT_TIMEOUT_S = 10.0


class CPError(AssertionError):
    """The CP refused a call. `status_code` and `problem` (the parsed problem+json body, or None when
    the body is not JSON) say why; an AssertionError, so a test whose set-up is refused fails."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status_code = response.status_code
        try:
            self.problem: Any = response.json()
        except ValueError:
            self.problem = None
        super().__init__(
            f"{response.request.method} {response.request.url.path} -> {response.status_code}: "
            f"{response.text}"
        )

    @property
    def fields(self) -> list[str]:
        """The fields the problem body names (`errors[].field`), in order."""
        errors = self.problem.get("errors", []) if isinstance(self.problem, dict) else []
        return [str(e.get("field")) for e in errors]


def fresh_id(prefix: str) -> str:
    """An id no other caller uses: `<prefix>-` and 8 hex digits."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class SyncFailed(AssertionError):
    """The gateway reached FAILED for the generation a caller waited on."""


def checked(response: httpx.Response, accept: Collection[int] = ()) -> Any:
    """The JSON body of a 2xx answer (None when empty; also None for a status in `accept`);
    CPError otherwise."""
    if response.status_code in accept:
        return None
    if not response.is_success:
        raise CPError(response)
    return response.json() if response.content else None


@dataclass(frozen=True)
class Call:
    """One request to the CP and how its answer becomes the value a caller gets."""

    method: str
    path: str
    body: Any = None
    accept: Collection[int] = ()  # statuses that are not a refusal here (the value is then None)
    then: Callable[[Any], Any] | None = None  # from the JSON body to the value returned
    token: str | None = None  # sent instead of the client's (a gateway's credential)

    @property
    def headers(self) -> dict[str, str] | None:
        return {"authorization": f"Bearer {self.token}"} if self.token else None


def _generation(body: Any) -> int:
    return int(body["generation"])


class CPCalls(Generic[R]):
    """Every CP call, written once. `R` is what a call returns: the value itself for `CPClient`, an
    awaitable of it for `AsyncCPClient`."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        gateway_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url
        self.gateway_id = gateway_id  # the gateway a call is about when it names none
        # What either transport's httpx client is built with.
        self.http_options: dict[str, Any] = {
            "base_url": base_url,
            "headers": {"authorization": f"Bearer {token}"} if token else {},
            "timeout": timeout,
        }

    def send(self, call: Call) -> R:
        raise NotImplementedError

    def _gateway(self, gateway_id: str | None) -> str:
        chosen = gateway_id or self.gateway_id
        if chosen is None:
            raise ValueError("no gateway_id given and none set on the client")
        return chosen

    # -- tenants ----------------------------------------------------------------------------------
    def create_tenant(self, tenant_id: str, name: str | None = None, *, exist_ok: bool = False) -> R:
        """The tenant as stored; with `exist_ok`, an existing tenant is not a refusal (None)."""
        body = {"tenant_id": tenant_id, "name": name or tenant_id}
        return self.send(Call("POST", "/v1/tenants", body, accept=(409,) if exist_ok else ()))

    def new_tenant(self, prefix: str = "t") -> R:
        """A tenant with a fresh id (`fresh_id(prefix)`); its id."""
        body = {"tenant_id": fresh_id(prefix), "name": "Tenant"}
        return self.send(Call("POST", "/v1/tenants", body, then=lambda t: t["tenant_id"]))

    def tenants(self) -> R:
        return self.send(Call("GET", "/v1/tenants"))

    # -- APIs -------------------------------------------------------------------------------------
    def create_api(
        self,
        api_id: str,
        *,
        tenant_id: str,
        upstream_url: str,
        methods: Sequence[str] = ("GET",),
        name: str | None = None,
        **fields: Any,
    ) -> R:
        """The API as stored. `fields` are the API's other fields (`path_prefix`, `timeout_ms`,
        `auth`, ...), sent as given."""
        body = {
            "api_id": api_id,
            "name": name or api_id,
            "upstream_url": upstream_url,
            "methods": list(methods),
            **fields,
        }
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/apis", body))

    def new_api(self, tenant_id: str, **fields: Any) -> R:
        """An HTTP API of the tenant with a fresh id unless `fields` give one (name "API", upstream
        http://127.0.0.1:9000, GET, unless `fields` say otherwise); its id."""
        body = {
            "api_id": fresh_id("api"),
            "name": "API",
            "upstream_url": "http://127.0.0.1:9000",
            "methods": ["GET"],
            **fields,
        }
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/apis", body, then=lambda a: a["api_id"]))

    def update_api(self, api_id: str, body: Mapping[str, Any], *, tenant_id: str) -> R:
        """Replace the API's fields with `body` (an `api_id` in it is left out: the id is the path's);
        the API as stored."""
        fields = {k: v for k, v in body.items() if k != "api_id"}
        return self.send(Call("PUT", f"/v1/tenants/{tenant_id}/apis/{api_id}", fields))

    def get_api(self, api_id: str, *, tenant_id: str) -> R:
        return self.send(Call("GET", f"/v1/tenants/{tenant_id}/apis/{api_id}"))

    def apis(self, tenant_id: str) -> R:
        return self.send(Call("GET", f"/v1/tenants/{tenant_id}/apis"))

    def delete_api(self, api_id: str, *, tenant_id: str) -> R:
        return self.send(Call("DELETE", f"/v1/tenants/{tenant_id}/apis/{api_id}"))

    # -- gateways and deployments -----------------------------------------------------------------
    def create_gateway(self, gateway_id: str, name: str | None = None) -> R:
        """The new gateway, with its `credential` (shown this once)."""
        body = {"gateway_id": gateway_id, "name": name or gateway_id}
        return self.send(Call("POST", "/v1/gateways", body))

    def new_gateway(self) -> R:
        """A gateway with a fresh id: (its id, its credential)."""
        body = {"gateway_id": fresh_id("gw"), "name": "Gateway"}
        return self.send(
            Call("POST", "/v1/gateways", body, then=lambda g: (g["gateway_id"], g["credential"]))
        )

    def gateway(self, gateway_id: str | None = None) -> R:
        return self.send(Call("GET", f"/v1/gateways/{self._gateway(gateway_id)}"))

    def generation(self, gateway_id: str | None = None) -> R:
        """The gateway's current (desired) generation, an int."""
        return self.send(Call("GET", f"/v1/gateways/{self._gateway(gateway_id)}", then=_generation))

    def deploy(self, api_id: str, gateway_id: str | None = None) -> R:
        """Activate the API on the gateway; the gateway's generation after it (an int)."""
        path = f"/v1/gateways/{self._gateway(gateway_id)}/deployments/{api_id}"
        return self.send(Call("PUT", path, then=_generation))

    def undeploy(self, api_id: str, gateway_id: str | None = None) -> R:
        """Deactivate the API on the gateway (its route leaves by a tombstone); the new generation."""
        path = f"/v1/gateways/{self._gateway(gateway_id)}/deployments/{api_id}"
        return self.send(Call("DELETE", path, then=_generation))

    def status(self, gateway_id: str | None = None) -> R:
        """The gateway's sync status: desired and acknowledged generation, state, last report."""
        return self.send(Call("GET", f"/v1/gateways/{self._gateway(gateway_id)}/status"))

    def desired_generation(self, gateway_id: str | None = None) -> R:
        path = f"/v1/gateways/{self._gateway(gateway_id)}/status"
        return self.send(Call("GET", path, then=lambda s: int(s["desired_generation"])))

    def preview(self, gateway_id: str | None = None, *, validate: bool = False) -> R:
        """What the gateway's Link would publish now (translation preview); `validate` also runs
        `envoy --mode validate` on it at the CP."""
        query = "?validate=envoy" if validate else ""
        return self.send(Call("GET", f"/v1/gateways/{self._gateway(gateway_id)}/preview{query}"))

    def inventory(self, gateway_id: str | None = None, *, credential: str | None = None) -> R:
        """The gateway's inventory as its Link fetches it, with the gateway's credential (`credential`,
        or the client's token)."""
        path = f"/v1/gateways/{self._gateway(gateway_id)}/config"
        return self.send(Call("GET", path, token=credential))

    # -- bulk publication -------------------------------------------------------------------------
    def bulk(
        self,
        tenant_id: str,
        *,
        apis: Sequence[Mapping[str, Any]] = (),
        deploy: Mapping[str, Sequence[str]] | None = None,
        undeploy: Mapping[str, Sequence[str]] | None = None,
    ) -> R:
        """Create or replace the API bodies `apis`, then deploy and undeploy api ids per gateway
        (`{gateway_id: [api_id, ...]}`), all in one transaction; the CP's answer (`generations` per
        gateway, `changed`, `created`, ...)."""
        body = {
            "apis": [dict(a) for a in apis],
            "deploy": [{"gateway_id": g, "api_ids": list(ids)} for g, ids in (deploy or {}).items()],
            "undeploy": [{"gateway_id": g, "api_ids": list(ids)} for g, ids in (undeploy or {}).items()],
        }
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/bulk", body))

    # -- policies ---------------------------------------------------------------------------------
    def create_policy(
        self,
        policy_id: str,
        policy_type: str,
        config: Mapping[str, Any],
        *,
        tenant_id: str | None,
        scope: str = "api",
        targets: Sequence[str] = (),
        gateway_id: str | None = None,
    ) -> R:
        """A tenant policy (scope `tenant` or `api`), or a gateway policy when `tenant_id` is None (on
        `gateway_id`, default the client's gateway); the policy as stored."""
        body: dict[str, Any] = {"policy_id": policy_id, "type": policy_type, "config": dict(config)}
        if tenant_id is None:
            return self.send(Call("POST", f"/v1/gateways/{self._gateway(gateway_id)}/policies", body))
        body.update(scope=scope, targets=list(targets))
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/policies", body))

    def delete_policy(self, policy_id: str, *, tenant_id: str | None, gateway_id: str | None = None) -> R:
        """Delete a tenant policy, or a gateway policy when `tenant_id` is None."""
        if tenant_id is None:
            path = f"/v1/gateways/{self._gateway(gateway_id)}/policies/{policy_id}"
        else:
            path = f"/v1/tenants/{tenant_id}/policies/{policy_id}"
        return self.send(Call("DELETE", path))

    # -- trusted issuers --------------------------------------------------------------------------
    def add_issuer(
        self,
        tenant_id: str,
        issuer: str,
        jwks_uri: str | None = None,
        *,
        jwks: Mapping[str, Any] | None = None,
    ) -> R:
        """Trust `issuer` for the tenant, by `jwks_uri` (the CP fetches the keys) or inline `jwks`;
        the issuer as stored (with its `issuer_id`)."""
        body: dict[str, Any] = {"issuer": issuer}
        if jwks_uri is not None:
            body["jwks_uri"] = jwks_uri
        if jwks is not None:
            body["jwks"] = dict(jwks)
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/issuers", body))

    def issuers(self, tenant_id: str) -> R:
        return self.send(Call("GET", f"/v1/tenants/{tenant_id}/issuers"))

    def refresh_issuer(self, tenant_id: str, issuer_id: str) -> R:
        """Fetch the issuer's keys now; what the refresh found."""
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/issuers/{issuer_id}/refresh"))

    def delete_issuer(self, tenant_id: str, issuer_id: str) -> R:
        return self.send(Call("DELETE", f"/v1/tenants/{tenant_id}/issuers/{issuer_id}"))

    # -- MCP tools, grants, revocations -------------------------------------------------------------
    def create_mcp_api(self, api_id: str, *, tenant_id: str, scopes: Sequence[str] = (), **fields: Any) -> R:
        """An MCP route (kind mcp: no upstream, a token, the identity envelope); the API as stored."""
        body = {
            "api_id": api_id,
            "name": fields.pop("name", api_id),
            "kind": "mcp",
            "methods": list(fields.pop("methods", ("GET", "POST", "DELETE"))),
            "auth": {"mode": "jwt", "scopes": list(scopes), "envelope": True},
            **fields,
        }
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/apis", body))

    def create_tool(self, name: str, *, tenant_id: str, **fields: Any) -> R:
        """The tool as stored; `fields` are its other fields (description, input_schema, api_id,
        method, path_template, output_schema, annotations), sent as given."""
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/tools", {"name": name, **fields}))

    def update_tool(self, name: str, body: Mapping[str, Any], *, tenant_id: str) -> R:
        return self.send(Call("PUT", f"/v1/tenants/{tenant_id}/tools/{name}", dict(body)))

    def tools(self, tenant_id: str) -> R:
        return self.send(Call("GET", f"/v1/tenants/{tenant_id}/tools"))

    def delete_tool(self, name: str, *, tenant_id: str) -> R:
        return self.send(Call("DELETE", f"/v1/tenants/{tenant_id}/tools/{name}"))

    def grant_tool(
        self,
        grant_id: str,
        tool: str,
        *,
        tenant_id: str,
        consumers: Sequence[str] = (),
        scopes: Sequence[str] = (),
    ) -> R:
        body = {"grant_id": grant_id, "tool": tool, "consumers": list(consumers), "scopes": list(scopes)}
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/tool-grants", body))

    def delete_grant(self, grant_id: str, *, tenant_id: str) -> R:
        return self.send(Call("DELETE", f"/v1/tenants/{tenant_id}/tool-grants/{grant_id}"))

    def revoke_tool(self, revocation_id: str, tool: str, *, tenant_id: str, consumer: str | None = None) -> R:
        body: dict[str, Any] = {"revocation_id": revocation_id, "tool": tool}
        if consumer is not None:
            body["consumer"] = consumer
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/tool-revocations", body))

    def lift_revocation(self, revocation_id: str, *, tenant_id: str) -> R:
        return self.send(Call("DELETE", f"/v1/tenants/{tenant_id}/tool-revocations/{revocation_id}"))

    # -- consumers, keys, plans, subscriptions ----------------------------------------------------
    def create_consumer(
        self, consumer_id: str, *, tenant_id: str, name: str | None = None, client_ids: Sequence[str] = ()
    ) -> R:
        body = {"consumer_id": consumer_id, "name": name or consumer_id, "client_ids": list(client_ids)}
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/consumers", body))

    def delete_consumer(self, consumer_id: str, *, tenant_id: str) -> R:
        return self.send(Call("DELETE", f"/v1/tenants/{tenant_id}/consumers/{consumer_id}"))

    def create_key(self, consumer_id: str, *, tenant_id: str) -> R:
        """A new API key: `{key_id, prefix, key, ...}`, the key shown this once."""
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/consumers/{consumer_id}/keys"))

    def keys(self, consumer_id: str, *, tenant_id: str) -> R:
        return self.send(Call("GET", f"/v1/tenants/{tenant_id}/consumers/{consumer_id}/keys"))

    def revoke_key(self, consumer_id: str, key_id: str, *, tenant_id: str) -> R:
        return self.send(Call("DELETE", f"/v1/tenants/{tenant_id}/consumers/{consumer_id}/keys/{key_id}"))

    def create_plan(
        self, plan_id: str, *, tenant_id: str, requests: int, window_seconds: int, billed: bool = False
    ) -> R:
        body = {"plan_id": plan_id, "requests": requests, "window_seconds": window_seconds, "billed": billed}
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/plans", body))

    def delete_plan(self, plan_id: str, *, tenant_id: str) -> R:
        return self.send(Call("DELETE", f"/v1/tenants/{tenant_id}/plans/{plan_id}"))

    def subscribe(
        self, subscription_id: str, *, tenant_id: str, consumer_id: str, api_id: str, plan_id: str
    ) -> R:
        body = {
            "subscription_id": subscription_id,
            "consumer_id": consumer_id,
            "api_id": api_id,
            "plan_id": plan_id,
        }
        return self.send(Call("POST", f"/v1/tenants/{tenant_id}/subscriptions", body))

    def set_subscription_state(self, subscription_id: str, state: str, *, tenant_id: str) -> R:
        """`state`: "active" or "suspended"; the subscription as stored."""
        path = f"/v1/tenants/{tenant_id}/subscriptions/{subscription_id}"
        return self.send(Call("PUT", path, {"state": state}))


def _value(call: Call, response: httpx.Response) -> Any:
    body = checked(response, call.accept)
    return call.then(body) if call.then is not None and body is not None else body


class CPClient(CPCalls[Any]):
    """The blocking client, plus what only makes sense while blocking: waiting for a gateway to settle.

    `options` are `CPCalls`'s (`gateway_id`, `timeout`); `describe` (optional) adds context to a wait
    that times out (for example the Link's log tail)."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        describe: Callable[[str], str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(base_url, token, **options)
        self.http = httpx.Client(**self.http_options)
        self.describe = describe

    def send(self, call: Call) -> Any:
        return _value(call, self.http.request(call.method, call.path, json=call.body, headers=call.headers))

    def answer(self, method: str, path: str, **request: Any) -> httpx.Response:
        """The CP's answer as it is (never raised); `request`: httpx's (json, content, headers, ...)."""
        return self.http.request(method, path, **request)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- compositions -----------------------------------------------------------------------------
    def add_policy(
        self, policy_id: str, policy_type: str, config: Mapping[str, Any], **placement: Any
    ) -> int:
        """`create_policy` (`placement`: its `tenant_id`, `scope`, `targets`, `gateway_id`), then the
        gateway's desired generation (the one to wait for)."""
        self.create_policy(policy_id, policy_type, config, **placement)
        return int(self.desired_generation(placement.get("gateway_id")))

    def wait_settled(
        self, generation: int | None = None, timeout: float = 30.0, gateway_id: str | None = None
    ) -> dict[str, Any]:
        """Poll the status until `generation` (default: the desired one now) is SYNCED or FAILED."""
        gateway_id = self._gateway(gateway_id)
        target = int(self.desired_generation(gateway_id)) if generation is None else generation

        def settled() -> dict[str, Any] | None:
            status = self.status(gateway_id)
            if int(status["desired_generation"]) == target and status["state"] == "FAILED":
                return status
            if int(status.get("acknowledged_generation") or 0) >= target and status["state"] == "SYNCED":
                return status
            return None

        try:
            return wait_until(settled, timeout, f"gateway {gateway_id} settled at generation {target}")
        except AssertionError as exc:
            context = self.describe(gateway_id) if self.describe is not None else ""
            raise AssertionError(
                f"{exc}; status now {self._status_or_error(gateway_id)}\n{context}"
            ) from None

    def wait_synced(
        self,
        generation: int | None = None,
        timeout: float = 30.0,
        gateway_id: str | None = None,
        *,
        past_failed: bool = False,
    ) -> dict[str, Any]:
        """The status once SYNCED at `generation` (default: the desired one now); SyncFailed if FAILED,
        unless `past_failed`: then a FAILED report is waited past, for the SYNCED one that replaces it
        when a client the Link waited for (Envoy, stoa-authz) connects after the ACK deadline."""
        if past_failed:
            gateway_id = self._gateway(gateway_id)
            target = int(self.desired_generation(gateway_id)) if generation is None else generation

            def synced() -> dict[str, Any] | None:
                status = self.status(gateway_id)
                acknowledged = int(status.get("acknowledged_generation") or 0)
                return status if status["state"] == "SYNCED" and acknowledged >= target else None

            return wait_until(synced, timeout, f"gateway {gateway_id} SYNCED at generation {target}")
        status = self.wait_settled(generation, timeout, gateway_id)
        if status["state"] != "SYNCED":
            raise SyncFailed(f"generation {status['desired_generation']} FAILED: {status.get('last_report')}")
        return status

    def wait_failed(
        self, generation: int | None = None, timeout: float = 30.0, gateway_id: str | None = None
    ) -> dict[str, Any]:
        """The status once FAILED at `generation` (its `last_report` says why); AssertionError if SYNCED."""
        status = self.wait_settled(generation, timeout, gateway_id)
        assert status["state"] == "FAILED", f"expected FAILED, got {status}"
        return status

    def _status_or_error(self, gateway_id: str) -> Any:
        try:
            return self.status(gateway_id)
        except (httpx.HTTPError, CPError) as exc:
            return repr(exc)


class AsyncCPClient(CPCalls[Awaitable[Any]]):
    """The same calls for code on an event loop (each returns an awaitable)."""

    def __init__(
        self, base_url: str, token: str | None, *, limits: httpx.Limits | None = None, **options: Any
    ) -> None:
        super().__init__(base_url, token, **options)
        pool = {"limits": limits} if limits is not None else {}
        self.http = httpx.AsyncClient(**self.http_options, **pool)

    async def send(self, call: Call) -> Any:
        response = await self.http.request(call.method, call.path, json=call.body, headers=call.headers)
        return _value(call, response)

    async def answer(self, method: str, path: str, **request: Any) -> httpx.Response:
        """The CP's answer as it is (never raised); `request`: httpx's (json, content, headers, ...)."""
        return await self.http.request(method, path, **request)

    async def generations(self, *gateway_ids: str) -> list[int]:
        """The gateways' current generations, in order."""
        return [await self.generation(gateway_id) for gateway_id in gateway_ids]

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
