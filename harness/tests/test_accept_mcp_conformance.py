"""The official MCP conformance suite (npm @modelcontextprotocol/conformance, server scenarios) against
a tenant's MCP route through the real Envoy, authorization service and MCP module. The suite cannot
send a token: a loopback proxy adds one. Its fixture tools are operations of a fixture API that a
test tenant registers and grants like any tool. Scenarios that do not apply to a tools server are in
conformance/expected-failures.yaml with the reason; every other one must pass."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from stoa_harness.conformance import (
    EXPECTED_FAILURES,
    FIXTURE_TOOLS,
    FixtureApi,
    TokenProxy,
    node_bin,
    run_suite,
)
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.wait import wait_until

AUDIENCE = "stoa-mcp-conformance"
TENANT = "conformance"
PREFIX = "/mcp/conformance"
SCOPE = "conformance:run"


@pytest.fixture(scope="module")
def fixture_api() -> Iterator[FixtureApi]:
    with FixtureApi() as api:
        yield api


@pytest.fixture(scope="module")
def gateway(estates: Callable[..., Estate], fixture_api: FixtureApi) -> Iterator[tuple[Estate, str]]:
    with DevIdentityProvider(alg="RS256", audience=AUDIENCE) as idp:
        estate = estates(
            EstateOptions(authz="service", mcp=True, authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE}),
            "conformance",
        )
        admin = estate.admin
        admin.create_tenant(TENANT)
        admin.add_issuer(TENANT, idp.issuer, jwks=idp.jwks())
        admin.create_api("fixture-api", tenant_id=TENANT, upstream_url=fixture_api.url, methods=["GET"])
        admin.create_mcp_api("conformance-mcp", tenant_id=TENANT, path_prefix=PREFIX)
        for name, (description, schema, path) in FIXTURE_TOOLS.items():
            admin.create_tool(
                name, tenant_id=TENANT, description=description, input_schema=schema, api_id="fixture-api",
                method="GET", path_template=path,
            )  # fmt: skip
            admin.grant_tool(f"run-{name.replace('_', '-')}", name, tenant_id=TENANT, scopes=[SCOPE])
        admin.wait_synced(admin.deploy("conformance-mcp"))
        ready = f"{estate.mcp_http_url}/health/ready"
        wait_until(lambda: httpx.get(ready, timeout=2).status_code == 200, 30, "the MCP module ready")
        yield estate, idp.mint(tenant=TENANT, scope=SCOPE, sub="conformance-suite", lifetime_s=3600)


def test_the_official_conformance_suite_passes(gateway: tuple[Estate, str], tmp_path: Path) -> None:
    assert (node_bin() / "conformance").exists(), "run `make setup` (npm ci --prefix conformance)"
    estate, token = gateway
    with TokenProxy(estate.url(PREFIX), token) as proxy:
        code, output, results = run_suite(f"{proxy.url}{PREFIX}", tmp_path)
    assert code == 0, output[-4000:]
    expected = {
        line.strip()[2:]
        for line in EXPECTED_FAILURES.read_text().splitlines()
        if line.strip().startswith("- ")
    }
    # The suite's summary: "✓ <scenario>: N passed, 0 failed" for each scenario that passed.
    passed = {m.group(1) for m in re.finditer(r"^✓ ([a-z0-9-]+):", output, re.MULTILINE)}
    assert len(results) == len(re.findall(r"^[✓✗] ", output, re.MULTILINE)), "a scenario without results"
    # What a tools server must do, through the gateway: all of it passed.
    assert {
        "server-initialize",
        "ping",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-image",
        "tools-call-audio",
        "tools-call-error",
        "dns-rebinding-protection",
    } <= passed, output[-4000:]
    assert not passed & expected, f"listed as expected failures but passing: {passed & expected}"
