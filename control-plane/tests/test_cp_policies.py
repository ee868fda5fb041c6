"""Policies: config validation and normal form of the supported types, refusal of the others, attribution
(`applicable`) per scope, and which gateways a policy change bumps."""

from __future__ import annotations

import pytest
from stoa_harness.cp_client import fresh_id

CORS = {
    "allowedOrigins": ["https://app.example.com", "https://*.example.com"],
    "allowedMethods": ["GET"],
    "allowedHeaders": ["authorization"],
    "exposeHeaders": ["x-request-id"],
    "maxAge": 600,
    "allowCredentials": True,
}

BAD_CONFIGS = [
    ("cors", {"allowedOrigins": []}, "config.allowedOrigins"),
    ("cors", {"allowedOrigins": ["example.com"]}, "config.allowedOrigins[0]"),
    ("cors", {"allowedOrigins": ["https://a.example.com/path"]}, "config.allowedOrigins[0]"),
    ("cors", {"allowedOrigins": ["*"], "allowCredentials": True}, "config.allowCredentials"),
    ("cors", {"allowedOrigins": ["*"], "allowCredentials": "yes"}, "config.allowCredentials"),
    ("cors", {"allowedOrigins": ["*"], "maxAge": -1}, "config.maxAge"),
    ("cors", {"allowedOrigins": ["*"], "allowedMethods": ["FETCH"]}, "config.allowedMethods[0]"),
    ("cors", {"allowedOrigins": ["*"], "exposeHeaders": ["bad header"]}, "config.exposeHeaders[0]"),
    ("cors", {"allowedOrigins": ["*"], "allowOrigin": "*"}, "config.allowOrigin"),
    ("rate_limit", {"maxRequests": 0, "intervalSeconds": 1}, "config.maxRequests"),
    ("rate_limit", {"maxRequests": 5, "intervalSeconds": 1.5}, "config.intervalSeconds"),
    ("rate_limit", {"maxRequests": 5}, "config.intervalSeconds"),
    ("ip_filter", {"mode": "block", "ip_list": ["10.0.0.0/8"]}, "config.mode"),
    ("ip_filter", {"mode": "allow", "ip_list": ["10.0.0.300"]}, "config.ip_list[0]"),
    ("ip_filter", {"mode": "deny", "ip_list": ["::1", "10.0.0.1/8"]}, "config.ip_list[1]"),
    ("ip_filter", {"mode": "deny", "ip_list": []}, "config.ip_list"),
    # Above what Envoy's token bucket (and the Link) take.
    ("rate_limit", {"maxRequests": 2**32, "intervalSeconds": 1}, "config.maxRequests"),
    ("rate_limit", {"maxRequests": 5, "intervalSeconds": 2**32}, "config.intervalSeconds"),
    ("cors", {"allowedOrigins": ["*"], "maxAge": 2**32}, "config.maxAge"),
    # What the store cannot carry as given.
    (
        "cors",
        {"allowedOrigins": ["https://a.example"], "allowedHeaders": ["a\u0000b"]},
        "config.allowedHeaders[0]",
    ),
    ("rate_limit", {"maxRequests": 10**400, "intervalSeconds": 1}, "config.maxRequests"),
    # What a site would refuse is refused at the write, named.
    ("cors", {"allowedOrigins": "https://a.example"}, "config.allowedOrigins"),
    (
        "cors",
        {"allowedOrigins": ["https://a.example"], "allowedMethods": ["GET", 7]},
        "config.allowedMethods[1]",
    ),
    ("rate_limit", {"maxRequests": "5", "intervalSeconds": 1}, "config.maxRequests"),
    ("rate_limit", {"maxRequests": True, "intervalSeconds": 1}, "config.maxRequests"),
    ("transform", {}, "config"),
    ("transform", {"request": {"headers": {"set": {"X-Upper": "1"}}}}, "config.request.headers.set.X-Upper"),
    ("transform", {"request": {"headers": {"remove": ["x-stoa-tenant-id"]}}}, "config.request.headers"),
    ("transform", {"response": {"json": [{"op": "set", "path": "/a"}]}}, "config.response.json[0].value"),
    ("transform", {"request": {"json": [{"op": "move", "path": "/a"}]}}, "config.request.json[0].op"),
    ("transform", {"request": {"json": [{"op": "remove", "path": "a"}]}}, "config.request.json[0].path"),
    (
        "transform",
        {"request": {"json": [{"op": "set", "path": "/a", "value": {"n": 2**60}}]}},
        "config.request.json[0].value",
    ),
    ("compression", {"algorithms": []}, "config.algorithms"),
    ("compression", {"algorithms": ["gzip", "deflate"]}, "config.algorithms[1]"),
    ("compression", {"algorithms": ["br", "br"]}, "config.algorithms"),
    ("compression", {"algorithms": ["br"], "minBytes": -1}, "config.minBytes"),
    ("token_budget", {"tokens": 100, "windowSeconds": 60}, "config.per"),
    ("token_budget", {"tokens": 0, "windowSeconds": 60, "per": "tenant"}, "config.tokens"),
    (
        "token_budget",
        {"tokens": 10, "windowSeconds": 60, "per": "tenant", "defaultMaxTokens": 11},
        "config.defaultMaxTokens",
    ),
]


@pytest.mark.parametrize(("policy_type", "config", "field"), BAD_CONFIGS)
async def test_bad_config_is_422_naming_the_field_and_changes_nothing(
    api, policy_type, config, field
) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, _ = await api.new_gateway()
    await api.deploy(await api.new_api(tenant_id), gateway_id)
    before = await api.generation(gateway_id)
    body = {"policy_id": fresh_id("p"), "type": policy_type, "config": config, "scope": "tenant"}
    response = await api.answer("POST", f"/v1/tenants/{tenant_id}/policies", json=body)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]
    gw_body = {"policy_id": fresh_id("p"), "type": policy_type, "config": config}
    assert (await api.answer("POST", f"/v1/gateways/{gateway_id}/policies", json=gw_body)).status_code == 422
    assert (await api.answer("GET", f"/v1/tenants/{tenant_id}/policies")).json() == []
    assert await api.generation(gateway_id) == before


@pytest.mark.parametrize(
    ("policy_type", "config", "stored"),
    [
        ("cors", CORS, CORS),
        # The normal form is stored (and published): upper-case methods, duplicates dropped.
        (
            "cors",
            {
                "allowedOrigins": ["https://a.example"],
                "allowedMethods": ["get", "post", "GET"],
                "maxAge": None,
            },
            {"allowedOrigins": ["https://a.example"], "allowedMethods": ["GET", "POST"]},
        ),
        (
            "rate_limit",
            {"maxRequests": 10, "intervalSeconds": 60},
            {"maxRequests": 10, "intervalSeconds": 60},
        ),
        (
            "ip_filter",
            {"mode": "allow", "ip_list": ["127.0.0.1", "10.0.0.0/8", "2001:DB8::/32", "::1/128"]},
            {"mode": "allow", "ip_list": ["127.0.0.1", "10.0.0.0/8", "2001:db8::/32", "::1"]},
        ),
        (
            "transform",
            {
                "request": {
                    "headers": {"set": {"x-b": "2", "x-a": "1"}, "remove": ["cookie"]},
                    "json": [{"op": "set", "path": "/a", "value": {"b": [1, None]}}],
                },
                "response": {"json": [{"op": "rename", "path": "/x", "to": "/y"}]},
            },
            {
                "request": {
                    "headers": {"set": {"x-a": "1", "x-b": "2"}, "remove": ["cookie"]},
                    "json": [{"op": "set", "path": "/a", "value": {"b": [1.0, None]}}],
                },
                "response": {"headers": {}, "json": [{"op": "rename", "path": "/x", "to": "/y"}]},
            },
        ),
        # Algorithms in one order whatever the order given; Envoy's default threshold made explicit.
        ("compression", {"algorithms": ["gzip", "zstd"]}, {"algorithms": ["zstd", "gzip"], "minBytes": 30}),
        # The default reservation made explicit (1024, or the whole budget when smaller).
        (
            "token_budget",
            {"tokens": 500, "windowSeconds": 60, "per": "tenant"},
            {"tokens": 500, "windowSeconds": 60, "per": "tenant", "defaultMaxTokens": 500},
        ),
    ],
)
async def test_supported_types_are_stored_in_normal_form(api, policy_type, config, stored) -> None:
    tenant_id = await api.new_tenant()
    policy_id = fresh_id("p")
    body = {"policy_id": policy_id, "type": policy_type, "config": config, "scope": "tenant"}
    created = await api.answer("POST", f"/v1/tenants/{tenant_id}/policies", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["config"] == stored
    got = (await api.answer("GET", f"/v1/tenants/{tenant_id}/policies/{policy_id}")).json()
    assert (got["type"], got["config"], got["scope"], got["tenant_id"], got["invalid_reason"]) == (
        policy_type,
        stored,
        "tenant",
        tenant_id,
        None,
    )


@pytest.mark.parametrize("policy_type", ["jwt_validation", "logging", "caching", "waf", "oidc", "new"])
async def test_an_unsupported_type_is_422_naming_the_supported_ones(api, policy_type) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, _ = await api.new_gateway()
    body = {"policy_id": fresh_id("p"), "type": policy_type, "config": {}, "scope": "tenant"}
    for url, payload in [
        (f"/v1/tenants/{tenant_id}/policies", body),
        (f"/v1/gateways/{gateway_id}/policies", {k: v for k, v in body.items() if k != "scope"}),
    ]:
        response = await api.answer("POST", url, json=payload)
        assert response.status_code == 422, response.text
        (error,) = response.json()["errors"]
        assert error["field"] == "type"
        assert error["message"] == (
            f"{policy_type!r} is not a supported type "
            "(supported: cors, rate_limit, ip_filter, guardrails, transform, opa, compression, token_budget)"
        )
    assert (await api.answer("GET", f"/v1/tenants/{tenant_id}/policies")).json() == []


async def test_policy_shape_errors(api) -> None:
    tenant_id = await api.new_tenant()
    foreign = await api.new_tenant()
    foreign_api = await api.new_api(foreign)
    base = {"type": "rate_limit", "config": {"maxRequests": 1, "intervalSeconds": 1}}
    cases = [
        ({**base, "scope": "tenant", "targets": ["x"]}, "targets", 422),
        # Another tenant's API is as unknown as none: the stored state says no (404), not the body.
        ({**base, "scope": "api", "targets": [foreign_api]}, "targets[0]", 404),
        ({**base, "scope": "gateway"}, "scope", 422),
        ({**base, "scope": "api", "config": []}, "config", 422),
        ({"scope": "tenant", "config": {}}, "type", 422),
    ]
    for body, field, status in cases:
        response = await api.answer(
            "POST", f"/v1/tenants/{tenant_id}/policies", json={"policy_id": fresh_id("p"), **body}
        )
        assert response.status_code == status, (body, response.text)
        assert field in [e["field"] for e in response.json()["errors"]], response.text
    policy_id = fresh_id("p")
    ok = {"policy_id": policy_id, **base, "scope": "tenant"}
    assert (await api.answer("POST", f"/v1/tenants/{tenant_id}/policies", json=ok)).status_code == 201
    dup = await api.answer("POST", f"/v1/tenants/{foreign}/policies", json=ok)
    assert dup.status_code == 409
    assert dup.json()["errors"][0]["field"] == "policy_id"
    unknown = await api.answer("POST", "/v1/tenants/nobody/policies", json={**ok, "policy_id": fresh_id("p")})
    assert unknown.status_code == 404
    assert unknown.json()["errors"][0]["field"] == "tenant_id"
    assert (await api.answer("GET", f"/v1/tenants/{foreign}/policies/{policy_id}")).status_code == 404


@pytest.fixture
async def layout(api) -> dict:
    """Tenants A (apis a1, a2, a3) and B (b1); g1 serves a1, a2, b1; g2 serves a1; g3 serves b1;
    g4 serves nothing. a3 is deployed nowhere."""
    ta, tb = await api.new_tenant(), await api.new_tenant()
    ids = {"ta": ta, "tb": tb}
    for name, tenant in (("a1", ta), ("a2", ta), ("a3", ta), ("b1", tb)):
        ids[name] = await api.new_api(tenant, api_id=fresh_id(name))
    creds = {}
    for g in ("g1", "g2", "g3", "g4"):
        ids[g], creds[g] = await api.new_gateway()
    for g, apis in (("g1", ("a1", "a2", "b1")), ("g2", ("a1",)), ("g3", ("b1",))):
        for a in apis:
            await api.deploy(ids[a], ids[g])
    ids["creds"] = creds
    return ids


# (how the policy is created, {gateway: applicable api names, or None when not listed})
ATTRIBUTION = [
    ("tenant A", {"g1": ["a1", "a2"], "g2": ["a1"], "g3": None, "g4": None}),
    ("api A [a2]", {"g1": ["a2"], "g2": [], "g3": None, "g4": None}),
    ("api A [a1, a3]", {"g1": ["a1"], "g2": ["a1"], "g3": None, "g4": None}),
    ("api A []", {"g1": [], "g2": [], "g3": None, "g4": None}),
    ("tenant B", {"g1": ["b1"], "g2": None, "g3": ["b1"], "g4": None}),
    ("gateway g1", {"g1": ["a1", "a2", "b1"], "g2": None, "g3": None, "g4": None}),
    ("gateway g4", {"g1": None, "g2": None, "g3": None, "g4": []}),
]


@pytest.mark.parametrize(("how", "expected"), ATTRIBUTION)
async def test_attribution_and_reach(api, layout, how, expected) -> None:
    kind, _, rest = how.partition(" ")
    owner, _, targets = rest.partition(" ")
    policy_id = fresh_id("p")
    gateways = ("g1", "g2", "g3", "g4")
    before = await api.generations(*(layout[g] for g in gateways))
    config = {"maxRequests": 5, "intervalSeconds": 1}
    if kind == "gateway":
        owned: dict = {"tenant_id": None, "gateway_id": layout[owner]}
        placement: dict = {}
    else:
        owned = {"tenant_id": layout["t" + owner.lower()]}
        names = [n for n in targets.strip("[]").split(", ") if n]
        placement = {"scope": kind, "targets": [layout[n] for n in names]}
    await api.create_policy(policy_id, "rate_limit", config, **owned, **placement)

    after = await api.generations(*(layout[g] for g in gateways))
    for g, b, a in zip(gateways, before, after, strict=True):
        # Exactly the gateways whose inventory lists the policy got one new generation.
        assert a == b + (0 if expected[g] is None else 1), g
        inv = await api.inventory(layout[g], credential=layout["creds"][g])
        listed = [p for p in inv["policies"] if p["policy_id"] == policy_id]
        if expected[g] is None:
            assert listed == [], g
            continue
        (policy,) = listed
        assert policy["applicable"] == sorted(layout[n] for n in expected[g]), g
        assert policy["scope"] == kind
        assert policy["targets"] == sorted(placement.get("targets", []))
        assert policy["tenant_id"] == ("" if kind == "gateway" else layout["t" + owner.lower()])
        assert policy["rate_limit"] == {"max_requests": 5, "interval_seconds": 1}

    # Delete bumps the same gateways once more.
    await api.delete_policy(policy_id, **owned)
    final = await api.generations(*(layout[g] for g in gateways))
    assert [f - a for f, a in zip(final, after, strict=True)] == [
        0 if expected[g] is None else 1 for g in gateways
    ]


async def test_policy_update_bumps_once_and_identical_update_not_at_all(api, layout) -> None:
    ta = layout["ta"]
    policy_id = fresh_id("p")
    body = {"type": "cors", "config": {"allowedOrigins": ["https://a.example.com"]}, "scope": "tenant"}
    await api.create_policy(policy_id, "cors", body["config"], tenant_id=ta, scope="tenant")
    before = await api.generations(layout["g1"], layout["g3"])
    assert (await api.answer("PUT", f"/v1/tenants/{ta}/policies/{policy_id}", json=body)).status_code == 200
    assert await api.generations(layout["g1"], layout["g3"]) == before
    changed = {**body, "scope": "api", "targets": [layout["a2"]]}
    updated = await api.answer("PUT", f"/v1/tenants/{ta}/policies/{policy_id}", json=changed)
    assert updated.status_code == 200
    assert updated.json()["scope"] == "api"
    assert await api.generations(layout["g1"], layout["g3"]) == [before[0] + 1, before[1]]
    bad = {**changed, "config": {"allowedOrigins": ["*"], "allowCredentials": True}}
    assert (await api.answer("PUT", f"/v1/tenants/{ta}/policies/{policy_id}", json=bad)).status_code == 422
    assert await api.generations(layout["g1"], layout["g3"]) == [before[0] + 1, before[1]]

    gw_policy = fresh_id("p")
    g4 = layout["g4"]
    gw_body = {"type": "ip_filter", "config": {"mode": "deny", "ip_list": ["10.0.0.0/8"]}}
    await api.create_policy(gw_policy, "ip_filter", gw_body["config"], tenant_id=None, gateway_id=g4)
    g4_gen = await api.generation(g4)
    assert (
        await api.answer("PUT", f"/v1/gateways/{g4}/policies/{gw_policy}", json=gw_body)
    ).status_code == 200
    assert await api.generation(g4) == g4_gen
    gw_body["config"]["mode"] = "allow"
    assert (
        await api.answer("PUT", f"/v1/gateways/{g4}/policies/{gw_policy}", json=gw_body)
    ).status_code == 200
    assert await api.generation(g4) == g4_gen + 1
    assert (await api.answer("GET", f"/v1/gateways/{g4}/policies/{gw_policy}")).json()["config"][
        "mode"
    ] == "allow"


async def test_deploying_a_tenants_first_route_brings_its_policies(api, layout) -> None:
    ta, g4 = layout["ta"], layout["g4"]
    policy_id = fresh_id("p")
    config = {"maxRequests": 1, "intervalSeconds": 1}
    await api.create_policy(policy_id, "rate_limit", config, tenant_id=ta, scope="tenant")
    inv = await api.inventory(g4, credential=layout["creds"]["g4"])
    assert [p["policy_id"] for p in inv["policies"]] == []
    await api.deploy(layout["a3"], g4)
    inv = await api.inventory(g4, credential=layout["creds"]["g4"])
    assert [(p["policy_id"], p["applicable"]) for p in inv["policies"]] == [(policy_id, [layout["a3"]])]
