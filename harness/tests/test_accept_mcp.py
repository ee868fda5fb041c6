"""The MCP module through a real Envoy, with the real `mcp` client: the real CP signs the tool
permissions, the real Link relays them and routes the MCP routes, stoa-authz identifies the caller
(the envelope), the module lists and calls the tenant's tools on the echo upstream.

Artifacts a correct CP never produces (forged, `alg: none`, unknown `kid`, older `seq`, about to
expire) are written into the CP's own store, as a compromised or broken CP would publish them, and
travel the real path (SSE → Link → ADS) to the module.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from stoa_cp.permissions import Signer
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.metrics import scrape
from stoa_harness.wait import wait_until

AUDIENCE = "stoa-mcp-accept"
TENANT = "acme"
OTHER = "beta"
ACME_MCP = "/mcp/acme"
BETA_MCP = "/mcp/beta"
ORDER = {
    "type": "object",
    "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}},
    "required": ["id"],
}
T = TypeVar("T")


@pytest.fixture(scope="module")
def idp() -> Iterator[DevIdentityProvider]:
    with DevIdentityProvider(alg="RS256", audience=AUDIENCE) as provider:
        yield provider


@pytest.fixture(scope="module")
def estate(idp: DevIdentityProvider, estates: Callable[..., Estate]) -> Estate:
    estate = estates(
        EstateOptions(
            authz="service",
            mcp=True,
            authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE},
            cp_env={"STOA_CP_MCP_PERMISSIONS_CHECK_S": "0.5"},
        ),
        "mcp",
    )
    admin = estate.admin
    for tenant, prefix in ((TENANT, ACME_MCP), (OTHER, BETA_MCP)):
        admin.create_tenant(tenant, exist_ok=True)
        admin.add_issuer(tenant, idp.issuer, jwks=idp.jwks())
        backing = f"{tenant}-orders"
        estate.create_api(backing, tenant_id=tenant, methods=["GET", "POST", "DELETE"])
        admin.create_mcp_api(f"{tenant}-mcp", tenant_id=tenant, path_prefix=prefix)
        admin.deploy(f"{tenant}-mcp")
    tool = {"input_schema": ORDER, "path_template": "/orders/{id}"}
    admin.create_tool(
        "get_order",
        tenant_id=TENANT,
        description="Read an order",
        api_id="acme-orders",
        method="GET",
        annotations={"readOnlyHint": True},
        **tool,
    )
    admin.create_tool(
        "delete_order",
        tenant_id=TENANT,
        description="Delete an order",
        api_id="acme-orders",
        method="DELETE",
        **tool,
    )
    admin.create_tool(
        "place_order",
        tenant_id=TENANT,
        description="Place an order",
        api_id="acme-orders",
        method="POST",
        input_schema={"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
        output_schema={
            "type": "object",
            "properties": {"method": {"type": "string"}},
            "required": ["method"],
        },
        path_template="/orders",
    )
    admin.create_tool(
        "beta_tool", tenant_id=OTHER, description="Beta's", api_id="beta-orders", method="GET", **tool
    )
    admin.create_tool(
        "count_order",
        tenant_id=TENANT,
        description="Counted",
        api_id="acme-orders",
        method="GET",
        budget={"calls": 2, "window_seconds": 3600},
        **tool,
    )
    admin.grant_tool("read-by-scope", "get_order", tenant_id=TENANT, scopes=["tools:read"])
    admin.grant_tool("counted", "count_order", tenant_id=TENANT, consumers=["budgeted", "other-budgeted"])
    admin.grant_tool("place-by-alice", "place_order", tenant_id=TENANT, consumers=["alice"])
    admin.grant_tool("beta-read", "beta_tool", tenant_id=OTHER, scopes=["tools:read"])
    admin.wait_synced()
    wait_until(lambda: ready(estate) is not None, 30, "the MCP module ready")
    return estate


def ready(estate: Estate) -> dict[str, Any] | None:
    """The module's readiness document when ready, else None."""
    reply = httpx.get(f"{estate.mcp_http_url}/health/ready", timeout=2)
    return reply.json() if reply.status_code == 200 else None


def readiness(estate: Estate) -> tuple[int, dict[str, Any]]:
    reply = httpx.get(f"{estate.mcp_http_url}/health/ready", timeout=2)
    return reply.status_code, reply.json()


def held_seq(estate: Estate) -> int:
    return int(scrape(estate.mcp_http_url, timeout=2)["stoa_mcp_permissions_seq"])


def refusals(estate: Estate, reason: str) -> int:
    """Refusals whose reason starts with `reason` (the label holds the reason's first 120 characters)."""
    prefix = f'stoa_mcp_permissions_refused_total{{reason="{reason}'
    return int(sum(v for k, v in scrape(estate.mcp_http_url, timeout=2).items() if k.startswith(prefix)))


def with_client(
    estate: Estate, prefix: str, token: str, use: Callable[[Client], Awaitable[T]], **options: Any
) -> T:
    async def run() -> T:
        async with httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=10) as http:
            transport = streamable_http_client(estate.mcp_url(prefix), http_client=http)
            async with Client(transport, cache=None, **options) as client:
                return await use(client)

    return asyncio.run(run())


def tool_names(estate: Estate, token: str, prefix: str = ACME_MCP) -> list[str]:
    async def names(client: Client) -> list[str]:
        return sorted(t.name for t in (await client.list_tools()).tools)

    return with_client(estate, prefix, token, names)


def call(estate: Estate, token: str, name: str, arguments: dict[str, Any], prefix: str = ACME_MCP) -> Any:
    """The tool's result, or the MCPError it raised."""

    async def run(client: Client) -> Any:
        try:
            return await client.call_tool(name, arguments)
        except MCPError as exc:
            return exc

    return with_client(estate, prefix, token, run)


def reader(idp: DevIdentityProvider, sub: str = "bob", tenant: str = TENANT) -> str:
    return idp.mint(tenant=tenant, scope="tools:read", sub=sub)


def test_a_granted_tool_is_listed_and_called_through_envoy(estate: Estate, idp: DevIdentityProvider) -> None:
    token = reader(idp)
    assert tool_names(estate, token) == ["get_order"]
    estate.upstream.clear()
    result = call(estate, token, "get_order", {"id": "42"})
    assert not result.is_error, result
    echoed = json.loads(result.content[0].text)
    assert echoed["method"] == "GET"
    assert echoed["path"] == "/orders/42"
    [arrival] = estate.upstream.arrivals()
    # The backing API got the caller's identity envelope (signed by stoa-authz), not the token.
    assert arrival.header("x-stoa-identity")
    assert arrival.header("authorization") is None
    # The handshake-era client (sessions) is served the same.
    legacy = with_client(estate, ACME_MCP, token, lambda c: c.list_tools(), mode="legacy")
    assert [t.name for t in legacy.tools] == ["get_order"]


def test_the_envelope_a_backing_api_got_cannot_call_the_module_again(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    """The backing API gets the caller's envelope; presented to the module directly, within its
    lifetime, it opens no session and calls nothing (the module takes each envelope once)."""
    estate.upstream.clear()
    assert not call(estate, reader(idp), "get_order", {"id": "7"}).is_error
    [arrival] = estate.upstream.arrivals()
    envelope = arrival.header("x-stoa-identity")
    assert envelope
    opened = mcp_post(estate, "", INITIALIZE, envelope=envelope)
    if opened.status_code == 200:  # what the replay would go on to do
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        calling = {"jsonrpc": "2.0", "id": 3, "method": "tools/call"}
        calling["params"] = {"name": "get_order", "arguments": {"id": "8"}}
        mcp_post(estate, "", calling, session, envelope=envelope)
    assert [a.path for a in estate.upstream.arrivals()] == ["/orders/7"]
    assert (opened.status_code, opened.json()) == (403, {"error": "not_identified"})


def test_a_tools_call_reaches_its_api_once(estate: Estate, idp: DevIdentityProvider) -> None:
    """Neither the module nor Envoy sends a tools/call again: an API answering 503 is reached once and
    the agent gets an error result; Envoy's MCP routes carry no retry policy."""
    token = reader(idp)
    estate.upstream.clear()
    estate.upstream.reply_with(status=503)
    try:
        result = call(estate, token, "get_order", {"id": "503"})
        arrivals = [a.path for a in estate.upstream.arrivals()]
    finally:
        estate.upstream.clear()
    assert result.is_error
    assert result.content[0].text.startswith("the API answered 503")
    assert arrivals == ["/orders/503"]
    dump = estate.envoy.config_dump("dynamic_route_configs")
    hosts = [host for cfg in dump["configs"] for host in cfg["route_config"]["virtual_hosts"]]
    mcp_routes = [
        route
        for host in hosts
        for route in host["routes"]
        if route["match"].get("path_separated_prefix") == ACME_MCP
    ]
    assert mcp_routes
    assert all("retry_policy" not in route["route"] for route in mcp_routes)
    assert all("retry_policy" not in host for host in hosts)


def test_hidden_unknown_and_other_tenant_tools_give_one_error(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    token = reader(idp)
    estate.upstream.clear()
    answers = {name: call(estate, token, name, {"id": "1"}) for name in ("delete_order", "nope", "beta_tool")}
    for name, answer in answers.items():
        assert isinstance(answer, MCPError), answer
        assert answer.message == f"Unknown tool: {name}"
        assert answer.code == answers["nope"].code
    assert estate.upstream.arrivals() == []
    # Beta's caller sees beta's tool on beta's route, and never acme's.
    beta = reader(idp, tenant=OTHER)
    assert tool_names(estate, beta, BETA_MCP) == ["beta_tool"]
    assert isinstance(call(estate, beta, "get_order", {"id": "1"}, BETA_MCP), MCPError)
    # A token of one tenant on another tenant's MCP route is refused before the module.
    assert (
        httpx.post(
            estate.url(BETA_MCP), headers={"authorization": f"Bearer {token}"}, json={}, timeout=5
        ).status_code
        == 403
    )


def test_arguments_are_checked_and_structured_content_returned(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    token = reader(idp)
    estate.upstream.clear()
    bad = call(estate, token, "get_order", {"id": "../admin"})
    assert bad.is_error
    assert "invalid arguments" in bad.content[0].text
    assert estate.upstream.arrivals() == []
    alice = idp.mint(tenant=TENANT, scope="", sub="alice")
    assert tool_names(estate, alice) == ["place_order"]
    placed = call(estate, alice, "place_order", {"item": "tea"})
    assert not placed.is_error, placed
    assert placed.structured_content["method"] == "POST"
    assert json.loads(placed.structured_content["body"]) == {"item": "tea"}


def test_a_revocation_applies_at_once_and_is_lifted(estate: Estate, idp: DevIdentityProvider) -> None:
    token = reader(idp)
    before = held_seq(estate)
    estate.admin.revoke_tool("no-bob", "get_order", tenant_id=TENANT, consumer="bob")
    wait_until(lambda: held_seq(estate) > before, 10, "the revocation at the module")
    assert tool_names(estate, token) == []
    assert isinstance(call(estate, token, "get_order", {"id": "1"}), MCPError)
    assert tool_names(estate, reader(idp, sub="carol")) == ["get_order"]
    lifted = held_seq(estate)
    estate.admin.lift_revocation("no-bob", tenant_id=TENANT)
    wait_until(lambda: held_seq(estate) > lifted, 10, "the lifted revocation at the module")
    assert tool_names(estate, token) == ["get_order"]


# -- artifacts a correct CP never signs ------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _current(estate: Estate) -> tuple[int, str]:
    async def read() -> tuple[int, str]:
        conn = await asyncpg.connect(estate.database_url)
        try:
            row = await conn.fetchrow(
                "SELECT seq, jws FROM tool_permissions WHERE gateway_id = $1", estate.gateway_id
            )
        finally:
            await conn.close()
        return int(row["seq"]), row["jws"]

    return asyncio.run(read())


def _publish(estate: Estate, seq: int, jws: str) -> None:
    """Put `jws` in the CP's store as the gateway's current artifact (fresh for the CP's keeper, so it
    is not re-signed on its own) and announce it: the CP streams it, the Link relays it."""

    async def write() -> None:
        conn = await asyncpg.connect(estate.database_url)
        try:
            await conn.execute(
                "UPDATE tool_permissions SET seq = $2, jws = $3, expires_at = $4 WHERE gateway_id = $1",
                estate.gateway_id,
                seq,
                jws,
                datetime.fromtimestamp(time.time() + 600, UTC),
            )
            await conn.execute("SELECT pg_notify('stoa_tool_permissions', $1)", estate.gateway_id)
        finally:
            await conn.close()

    asyncio.run(write())


def _claims(jws: str) -> dict[str, Any]:
    body = jws.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def _everything_granted(claims: dict[str, Any], seq: int) -> dict[str, Any]:
    grant = {
        "grant_id": "all",
        "tenant_id": TENANT,
        "tool": "delete_order",
        "consumers": ["bob"],
        "scopes": [],
    }
    return {**claims, "seq": seq, "jti": f"forged-{seq}", "grants": [*claims["grants"], grant]}


def _resign(estate: Estate) -> None:
    """A legitimate change, so the CP signs (and the module holds) a correct artifact again."""
    before = held_seq(estate)
    estate.admin.grant_tool("nudge", "get_order", tenant_id=TENANT, consumers=["nobody"])
    estate.admin.delete_grant("nudge", tenant_id=TENANT)
    wait_until(lambda: held_seq(estate) > before and ready(estate), 10, "a correct artifact held again")


@pytest.mark.parametrize("forgery", ["tampered signature", "alg none", "unknown kid", "rollback"])
def test_forged_and_older_artifacts_are_refused(
    estate: Estate, idp: DevIdentityProvider, forgery: str
) -> None:
    token = reader(idp)
    seq, jws = _current(estate)
    wait_until(lambda: held_seq(estate) == seq, 10, "the module holding the current artifact")
    signer = Signer(estate.signing_key_dir, "stoa-cp", 600)
    head, _, signature = jws.split(".")
    claims = _claims(jws)
    if forgery == "tampered signature":
        body = _b64(json.dumps(_everything_granted(claims, seq + 1)).encode())
        forged, reason = f"{head}.{body}.{signature}", "bad signature"
    elif forgery == "alg none":
        none = _b64(
            json.dumps(
                {"alg": "none", "kid": json.loads(base64.urlsafe_b64decode(head + "=="))["kid"]}
            ).encode()
        )
        forged, reason = f"{none}.{_b64(json.dumps(_everything_granted(claims, seq + 1)).encode())}.", "alg"
    elif forgery == "unknown kid":
        _, good = signer.sign(_everything_granted(claims, seq + 1))
        good_head, good_body, good_sig = good.split(".")
        other = json.loads(base64.urlsafe_b64decode(good_head + "=="))
        other["kid"] = "unknown-kid"
        forged, reason = f"{_b64(json.dumps(other).encode())}.{good_body}.{good_sig}", "kid"
    else:
        # Correctly signed, fresh, but older than the artifact held: a rollback.
        now = int(time.time())
        _, forged = signer.sign({**_everything_granted(claims, 1), "iat": now, "exp": now + 600})
        reason = "seq"
    before = refusals(estate, reason)
    _publish(estate, seq + 1 if forgery != "rollback" else 1, forged)
    if forgery == "rollback":
        # A CP stream sends only newer artifacts and a Link relays only newer ones; a restarted Link
        # starts afresh and relays what the CP holds: the module is the last line and refuses it.
        estate.link.stop()
        estate.link.start()
    wait_until(lambda: refusals(estate, reason) > before, 20, f"the module refusing ({forgery})")
    assert held_seq(estate) == seq
    assert tool_names(estate, token) == ["get_order"]
    assert isinstance(call(estate, token, "delete_order", {"id": "1"}), MCPError)
    if forgery == "rollback":
        _publish(estate, seq, jws)  # the CP's own row back: its next seq is above the one held
    _resign(estate)


def test_an_expired_artifact_is_never_honoured(estate: Estate, idp: DevIdentityProvider) -> None:
    token = reader(idp)
    seq, jws = _current(estate)
    now = int(time.time())
    signer = Signer(estate.signing_key_dir, "stoa-cp", 600)
    _, short = signer.sign({**_claims(jws), "seq": seq + 1, "jti": "short", "iat": now, "exp": now + 3})
    _publish(estate, seq + 1, short)
    wait_until(lambda: held_seq(estate) == seq + 1, 10, "the short-lived artifact held")
    assert tool_names(estate, token) == ["get_order"]
    _, body = wait_until(
        lambda: (r := readiness(estate))[0] == 503 and r, 10, "the module to stop enforcing at exp"
    )
    assert body == {"status": "not_ready", "reason": "artifact_expired"}
    assert tool_names(estate, token) == []
    assert isinstance(call(estate, token, "get_order", {"id": "1"}), MCPError)
    _resign(estate)
    assert tool_names(estate, token) == ["get_order"]


def test_boot_without_a_valid_artifact_denies_and_is_not_ready(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    """The module restarted pinning only a key the CP does not sign with: every artifact it is sent
    is refused (unknown kid), so it holds none."""
    token = reader(idp)
    pinned = estate.trusted_keys.read_text()
    stranger = {"kty": "OKP", "crv": "Ed25519", "kid": "stranger", "x": _b64(b"\x01" * 32)}
    estate.trusted_keys.write_text(json.dumps({"keys": [stranger]}))
    try:
        estate.mcp.stop()
        estate.mcp.start()
        wait_until(lambda: refusals(estate, "kid") > 0, 15, "the module refusing the CP's artifact")
        assert readiness(estate) == (503, {"status": "not_ready", "reason": "no_artifact"})
        assert tool_names(estate, token) == []
        assert isinstance(call(estate, token, "get_order", {"id": "1"}), MCPError)
    finally:
        estate.trusted_keys.write_text(pinned)
        estate.mcp.stop()
        estate.mcp.start()
    wait_until(lambda: ready(estate), 15, "the module ready with its keys back")
    assert tool_names(estate, token) == ["get_order"]


def test_a_rotated_signing_key_is_used_and_both_keys_verify(
    estate: Estate, idp: DevIdentityProvider, tmp_path: Path
) -> None:
    token = reader(idp)
    old_kid = ready(estate)["kid"]
    new_kid = estate.rotate_signing_key()
    doc = wait_until(
        lambda: (r := ready(estate)) and r["kid"] == new_kid and r, 20, "an artifact of the new key"
    )
    assert doc["kid"] != old_kid
    assert json.loads(estate.trusted_keys.read_text())["keys"][0]["kid"] == old_kid
    assert tool_names(estate, token) == ["get_order"]
    # The overlap: an artifact the old key signed (a CP that has not rotated yet) is still honoured.
    old_keys = tmp_path / "old-keys"
    old_keys.mkdir()
    (old_keys / "0001.pem").write_bytes(min(estate.signing_key_dir.glob("*.pem")).read_bytes())
    seq, jws = _current(estate)
    now = int(time.time())
    _, by_old_key = Signer(old_keys, "stoa-cp", 600).sign(
        {**_claims(jws), "seq": seq + 1, "iat": now, "exp": now + 600}
    )
    _publish(estate, seq + 1, by_old_key)
    held = wait_until(
        lambda: (r := ready(estate)) and r["seq"] == seq + 1 and r, 10, "the old key's artifact held"
    )
    assert held["kid"] == old_kid
    assert tool_names(estate, token) == ["get_order"]
    _resign(estate)


def test_unauthenticated_callers_are_told_where_the_resource_metadata_is(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    metadata_url = estate.url(f"/.well-known/oauth-protected-resource{ACME_MCP}")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    missing = httpx.post(estate.url(ACME_MCP), json=body, timeout=5)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == f'Bearer resource_metadata="{metadata_url}"'
    invalid = httpx.post(estate.url(ACME_MCP), json=body, headers={"authorization": "Bearer nope"}, timeout=5)
    assert invalid.status_code == 401
    assert (
        invalid.headers["www-authenticate"]
        == f'Bearer error="invalid_token", resource_metadata="{metadata_url}"'
    )
    # RFC 9728: at the gateway's root, without a token, answered by Envoy.
    document = httpx.get(metadata_url, timeout=5)
    assert document.status_code == 200
    assert document.json() == {
        "resource": estate.url(ACME_MCP),
        "authorization_servers": [idp.issuer],
        "bearer_methods_supported": ["header"],
        "scopes_supported": [],
        "resource_name": "acme-mcp",
    }


def mcp_post(
    estate: Estate,
    token: str,
    message: dict[str, Any],
    session: dict[str, str] | None = None,
    *,
    envelope: str = "",
) -> httpx.Response:
    """One JSON-RPC message POSTed to the acme MCP route as is, in a session when given its headers;
    `envelope`: to the module itself, bypassing Envoy, with that identity envelope instead of a token."""
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        **({"x-stoa-identity": envelope} if envelope else {"authorization": f"Bearer {token}"}),
        **(session or {}),
    }
    assert estate.site is not None
    url = f"http://127.0.0.1:{estate.site.mcp_port}{ACME_MCP}" if envelope else estate.url(ACME_MCP)
    return httpx.post(url, headers=headers, json=message, timeout=5)


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}


def open_session(estate: Estate, token: str) -> dict[str, str]:
    """A new session's headers."""
    opened = mcp_post(estate, token, INITIALIZE)
    assert opened.status_code == 200
    return {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}


LISTING = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def test_a_session_belongs_to_the_caller_that_opened_it(estate: Estate, idp: DevIdentityProvider) -> None:
    """Every stream of a session answers with one caller's decision: another caller naming the
    session's id is answered as for an unknown session, whatever it may call itself."""
    session = open_session(estate, reader(idp))
    hijack = mcp_post(estate, idp.mint(tenant=TENANT, scope="tools:read", sub="mallory"), LISTING, session)
    assert hijack.status_code == 404
    own = mcp_post(estate, reader(idp), LISTING, session)
    assert own.status_code == 200
    assert [t["name"] for t in own.json()["result"]["tools"]] == ["get_order"]


def test_a_session_opened_before_a_restart_is_unknown_after_it(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    """A restarted module holds no session: the old one's id is answered as unknown (its client opens
    a new one), no call on it reaches the API, and a new session works once the module is ready."""
    token = reader(idp)
    session = open_session(estate, token)
    estate.upstream.clear()
    estate.mcp.stop()
    estate.mcp.start()
    wait_until(lambda: ready(estate), 15, "the module ready again")
    calling = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "get_order", "arguments": {"id": "1"}},
    }
    stale = mcp_post(estate, token, calling, session)
    assert stale.status_code == 404
    assert stale.json()["error"]["message"] == "Session not found"
    assert estate.upstream.arrivals() == []
    fresh = mcp_post(estate, token, calling, open_session(estate, token))
    assert fresh.status_code == 200
    assert fresh.json()["result"]["isError"] is False
    assert len(estate.upstream.arrivals()) == 1


def test_a_budget_counts_calls_per_consumer_and_is_exhausted(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    budgeted = idp.mint(tenant=TENANT, sub="budgeted")
    assert tool_names(estate, budgeted) == ["count_order"]
    estate.upstream.clear()

    async def three_calls(client: Client) -> list[Any]:
        return [await client.call_tool("count_order", {"id": str(i)}) for i in range(3)]

    first, second, third = with_client(estate, ACME_MCP, budgeted, three_calls)
    assert not first.is_error
    assert not second.is_error
    assert third.is_error
    assert "budget exhausted (2 calls per 3600 s)" in third.content[0].text
    assert len(estate.upstream.arrivals()) == 2, "an exhausted call reached the API"

    def refusal_logged() -> bool:
        refused = {"outcome": "budget_exhausted", "tool": "count_order"}
        return any(refused.items() <= e.items() for e in estate.started_site.mcp_events("tool_call"))

    wait_until(refusal_logged, 10, "the budget's refusal in the module's call log")
    # Per consumer: another consumer of the same tool has its own budget.
    assert not call(
        estate, idp.mint(tenant=TENANT, sub="other-budgeted"), "count_order", {"id": "1"}
    ).is_error
