"""Translator properties the golden files cannot show on their own: stability, determinism, order."""

from __future__ import annotations

import re

import pytest
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import json_format
from stoa_proto import inventory_pb2
from stoa_proto.bodies import DENY_BODIES
from stoa_proto.paths import REFUSED_PATHS
from stoa_translate import TranslateOptions, Translator, translate
from stoa_translate.filters import EXT_PROC_FILTER, PROCESSED_BUFFER_FILTER
from stoa_translate.policies.cors import origin_matcher
from stoa_translate.policy_set import POLICY_BUCKETS, merged, route_bucket, route_version, set_version
from stoa_translate.refusal import FailureReason, Refusal
from stoa_translate.routes import (
    REFUSAL_ROUTES,
    ROUTE_CONFIG_NAME,
    ROUTE_TABLE_BUCKETS,
    SCOPE_KEY_HEADER,
    closed_table,
    scope_key,
    table_name,
)
from stoa_translate.snapshot import (
    AUTHZ_POLICY_SET,
    CLUSTER,
    ENVOY_TYPES,
    LISTENER,
    MCP_POLICY_SET,
    PROC_POLICY_SET,
    ROUTE,
    SCOPED_ROUTE,
    Snapshot,
    dangling_references,
)

OPTIONS = TranslateOptions()


def route(rid: str, upstream: str = "http://127.0.0.1:8080", **fields: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "route_id": rid,
        "tenant_id": "acme",
        "api_id": rid,
        "path_prefix": f"/apis/{rid}",
        "methods": ["GET"],
        "upstream_url": upstream,
    }
    doc.update(fields)
    return doc


def inventory(
    routes: list[dict[str, object]], generation: int = 1, **extra: object
) -> inventory_pb2.Inventory:
    doc = {"gateway_id": "gw-1", "generation": str(generation), "routes": routes, **extra}
    return json_format.ParseDict(doc, inventory_pb2.Inventory())


def policy(pid: str, kind: str, config: dict[str, object], applicable: list[str]) -> dict[str, object]:
    # A kind this contract does not know travels without a config member (there is none to set).
    typed = {kind: config} if config else {}
    return {"policy_id": pid, "type": kind, **typed, "scope": "api", "applicable": applicable}


def entries(snapshot: Snapshot) -> list:
    """The entries rendered for the inventory's routes (the first entries of all are the path refusals)."""
    (routes,) = snapshot.of(ROUTE)
    (vhost,) = routes.virtual_hosts
    refusals = len(REFUSAL_ROUTES)
    assert [r.name for r in vhost.routes[:refusals]] == [name for name, _ in REFUSAL_ROUTES]
    return list(vhost.routes[refusals:])


def cluster_of(snapshot: Snapshot) -> dict[str, str]:
    """Route id → the cluster its entries use (all entries of one route use the same one)."""
    found: dict[str, set[str]] = {}
    for entry in entries(snapshot):
        found.setdefault(entry.name.split(":")[0], set()).add(entry.route.cluster)
    assert all(len(c) == 1 for c in found.values())
    return {rid: next(iter(c)) for rid, c in found.items()}


def envoy_bytes(snapshot: Snapshot) -> dict[str, list[bytes]]:
    return {t: [r.SerializeToString(deterministic=True) for r in snapshot.of(t)] for t in ENVOY_TYPES}


def http_manager(snapshot: Snapshot) -> hcm_pb2.HttpConnectionManager:
    (listener,) = snapshot.of(LISTENER)
    manager = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    return manager


BACKENDS = [f"http://10.0.0.{i}:80{i}" for i in range(1, 6)]
BASE = [route(f"r{i}", BACKENDS[i]) for i in range(5)]

EDITS = {
    "switch backend": {"upstream_url": "https://new.example.com"},
    "share another route's backend": {"upstream_url": BACKENDS[0]},
    "change methods": {"methods": ["GET", "POST", "DELETE"]},
    "change prefix": {"path_prefix": "/v2/r2"},
    "change timeout": {"timeout_ms": 100},
}


@pytest.mark.parametrize("edit", EDITS.values(), ids=list(EDITS))
def test_editing_one_route_never_renames_another_routes_cluster(edit: dict[str, object]) -> None:
    before = cluster_of(translate(inventory(BASE), OPTIONS))
    edited = [dict(r, **edit) if r["route_id"] == "r2" else r for r in BASE]
    after = cluster_of(translate(inventory(edited, generation=2), OPTIONS))
    for rid in ("r0", "r1", "r3", "r4"):
        assert after[rid] == before[rid]
        assert after[rid].startswith("backend_http_10.0.0.")


def test_adding_or_removing_a_route_never_renames_another_routes_cluster() -> None:
    before = cluster_of(translate(inventory(BASE), OPTIONS))
    grown = cluster_of(translate(inventory([route("new", "http://10.9.9.9:1"), *BASE], 2), OPTIONS))
    shrunk = cluster_of(translate(inventory(BASE[1:], 3), OPTIONS))
    assert {k: grown[k] for k in before} == before
    assert {k: shrunk[k] for k in shrunk} == {k: before[k] for k in shrunk}


def test_cluster_named_by_backend_identity_and_shared() -> None:
    snapshot = translate(
        inventory([route("a", "https://API.example.com/x"), route("b", "https://api.example.com:443/y")]),
        OPTIONS,
    )
    assert snapshot.names(CLUSTER) == ["backend_https_api.example.com_443", "stoa-ext-authz", "stoa-ext-proc"]
    assert set(cluster_of(snapshot).values()) == {"backend_https_api.example.com_443"}


def test_same_inventory_same_version_whatever_the_input_order() -> None:
    policies = [
        policy("c", "cors", {"allowedOrigins": ["https://a.example"]}, ["r1", "r0"]),
        policy("r", "rate_limit", {"maxRequests": 3, "intervalSeconds": 1}, ["r3"]),
    ]
    one = translate(inventory(BASE, policies=policies), OPTIONS)
    again = translate(inventory(BASE, policies=policies), OPTIONS)
    shuffled = translate(inventory(BASE[::-1], policies=policies[::-1]), OPTIONS)
    assert one.version == again.version == shuffled.version
    assert one.resources == shuffled.resources


def test_generation_only_change_keeps_every_resource_byte_for_byte() -> None:
    first = translate(inventory(BASE, generation=1), OPTIONS)
    later = translate(inventory(BASE, generation=9), OPTIONS)
    assert envoy_bytes(first) == envoy_bytes(later)
    for type_url in (AUTHZ_POLICY_SET, PROC_POLICY_SET, MCP_POLICY_SET):
        assert [r.SerializeToString(deterministic=True) for r in first.of(type_url)] == [
            r.SerializeToString(deterministic=True) for r in later.of(type_url)
        ], type_url
    assert (first.version, first.generation, later.generation) == (later.version, 1, 9)


def test_content_change_changes_versions() -> None:
    first = translate(inventory(BASE), OPTIONS)
    scoped = translate(inventory([dict(BASE[0], scopes=["admin"]), *BASE[1:]], 2), OPTIONS)
    assert first.version != scoped.version
    assert merged(first.of(AUTHZ_POLICY_SET)).version != merged(scoped.of(AUTHZ_POLICY_SET)).version


def _context_extensions(
    holder: route_components_pb2.VirtualHost | route_components_pb2.Route,
) -> dict[str, str]:
    per_route = ext_authz_pb2.ExtAuthzPerRoute()
    holder.typed_per_filter_config["envoy.filters.http.ext_authz"].Unpack(per_route)
    return dict(per_route.check_settings.context_extensions)


def test_every_route_carries_its_context_extensions_with_its_own_entrys_version() -> None:
    snapshot = translate(inventory([route("a", tenant_id="t1", api_id="api-a"), route("b")]), OPTIONS)
    policy_set = merged(snapshot.of(AUTHZ_POLICY_SET))
    (config,) = snapshot.of(ROUTE)
    # Nothing of the policy set on the virtual host: a Check names its route's entry only.
    assert "envoy.filters.http.ext_authz" not in config.virtual_hosts[0].typed_per_filter_config
    versions = {r.route_id: route_version(r) for r in policy_set.routes}
    for entry in entries(snapshot):
        ext = _context_extensions(entry)
        assert set(ext) == {"tenant_id", "api_id", "route_id", "route_version"}
        assert ext["route_id"] == entry.name.split(":")[0]
        assert ext["route_version"] == versions[ext["route_id"]]
    assert {(r.route_id, r.tenant_id, r.api_id, r.auth_mode) for r in policy_set.routes} == {
        ("a", "t1", "api-a", "jwt"),
        ("b", "acme", "b", "jwt"),
    }


def test_a_policy_set_change_elsewhere_leaves_the_route_configuration_byte_identical() -> None:
    issuers = [{"tenant_id": "acme", "issuer": "https://idp.acme", "jwks_json": "{}"}]
    before = translate(inventory(BASE), OPTIONS)
    after = translate(inventory(BASE, 2, issuers=issuers), OPTIONS)
    assert merged(before.of(AUTHZ_POLICY_SET)).version != merged(after.of(AUTHZ_POLICY_SET)).version
    assert [r.SerializeToString(deterministic=True) for r in before.of(ROUTE)] == [
        r.SerializeToString(deterministic=True) for r in after.of(ROUTE)
    ]
    # A route's own change changes its entry's version, which its Envoy entries name.
    scoped = translate(inventory([dict(BASE[0], scopes=["admin"]), *BASE[1:]], 3), OPTIONS)
    route_id = BASE[0]["route_id"]
    named = {
        _context_extensions(e)["route_version"] for e in entries(scoped) if e.name.startswith(f"{route_id}:")
    }
    assert named == {
        route_version(r) for r in merged(scoped.of(AUTHZ_POLICY_SET)).routes if r.route_id == route_id
    }
    assert named.isdisjoint(
        _context_extensions(e)["route_version"] for e in entries(before) if e.name.startswith(f"{route_id}:")
    )


def test_a_new_route_leaves_the_other_route_entries_byte_identical() -> None:
    before = translate(inventory([route("a"), route("b")]), OPTIONS)
    after = translate(inventory([route("a"), route("b"), route("c")], 2), OPTIONS)
    assert merged(before.of(AUTHZ_POLICY_SET)).version != merged(after.of(AUTHZ_POLICY_SET)).version
    kept = {e.name: e.SerializeToString(deterministic=True) for e in entries(before)}
    now = {e.name: e.SerializeToString(deterministic=True) for e in entries(after)}
    assert kept == {name: body for name, body in now.items() if name in kept}


def test_policy_set_carries_issuers_of_present_tenants_only() -> None:
    issuers = [
        {"tenant_id": "acme", "issuer": "https://idp.acme", "jwks_json": "{}"},
        {"tenant_id": "other", "issuer": "https://idp.other", "jwks_json": "{}"},
    ]
    policy_set = merged(translate(inventory(BASE, issuers=issuers), OPTIONS).of(AUTHZ_POLICY_SET))
    assert [i.issuer for i in policy_set.issuers] == ["https://idp.acme"]
    assert (policy_set.name, policy_set.gateway_id) == ("default", "gw-1")


def test_prefix_boundary_and_longest_prefix_first() -> None:
    snapshot = translate(
        inventory([route("a", path_prefix="/apis/a"), route("z", path_prefix="/apis/a/b"), route("ab")]),
        OPTIONS,
    )
    matches = [(e.name, e.match.path_separated_prefix) for e in entries(snapshot)]
    # path_separated_prefix: /apis/a matches /apis/a and /apis/a/..., never /apis/ab.
    assert matches == [("z:GET", "/apis/a/b"), ("ab:GET", "/apis/ab"), ("a:GET", "/apis/a")]


def rewritten(entry: object, path: str) -> str:
    """What Envoy's prefix_rewrite / regex_rewrite does to a matched path (RE2 ⊂ re for these)."""
    action = entry.route
    if action.HasField("regex_rewrite"):
        rx = action.regex_rewrite
        return re.sub(rx.pattern.regex, rx.substitution, path, count=1)
    prefix = entry.match.path_separated_prefix or entry.match.prefix
    return action.prefix_rewrite + path[len(prefix) :] if action.prefix_rewrite else path


REWRITES = [
    ("http://h:1/base", "/apis/x", "/apis/x/foo?q=1", "/base/foo?q=1"),
    ("http://h:1/base", "/apis/x", "/apis/x", "/base"),
    ("http://h:1/base/", "/apis/x", "/apis/x/", "/base/"),
    ("http://h:1", "/apis/x", "/apis/x/foo", "/foo"),
    ("http://h:1", "/apis/x", "/apis/x", "/"),
    ("http://h:1/", "/apis/x-y", "/apis/x-y/a/b", "/a/b"),
    ("http://h:1", "/", "/anything", "/anything"),
    ("http://h:1/site", "/", "/anything", "/site/anything"),
]


@pytest.mark.parametrize(("upstream", "prefix", "path", "expected"), REWRITES)
def test_rewrite_replaces_the_prefix_by_the_upstream_base_path(
    upstream: str, prefix: str, path: str, expected: str
) -> None:
    (entry,) = entries(translate(inventory([route("x", upstream, path_prefix=prefix)]), OPTIONS))
    assert (
        rewritten(entry, path.split("?")[0]) + ("?" + path.split("?")[1] if "?" in path else "") == expected
    )


def test_one_entry_per_method_and_options_only_with_cors() -> None:
    cors = policy("c", "cors", {"allowedOrigins": ["*"]}, ["with"])
    snapshot = translate(
        inventory(
            [
                route("with", methods=["POST", "GET"]),
                route("without", methods=["GET", "POST"]),
                route("any", methods=[]),
            ],
            policies=[cors],
        ),
        OPTIONS,
    )
    names = [e.name for e in entries(snapshot)]
    assert sorted(names) == sorted(
        ["with:GET", "with:POST", "with:OPTIONS", "without:GET", "without:POST", "any:ANY"]
    )
    any_entry = next(e for e in entries(snapshot) if e.name == "any:ANY")
    assert not any_entry.match.headers


CHAIN = [
    ("envoy.filters.http.cors", True),
    ("envoy.filters.http.rbac", True),
    ("envoy.filters.http.buffer", True),
    ("stoa.rbac.request", True),
    ("envoy.filters.http.jwt_authn", True),
    ("stoa.rbac.claims", True),
    ("envoy.filters.http.ext_authz", False),
    ("envoy.filters.http.local_ratelimit", True),
    ("envoy.filters.http.ext_proc", True),
    ("stoa.buffer.processed", True),
    ("envoy.filters.http.router", False),
]


def test_the_filter_chain_is_the_same_whatever_the_routes_use() -> None:
    """Every filter from the first publication on, off but for the Check and the router: the first
    route of a kind changes routes only, never the listener (whose older copies Envoy keeps serving
    connections on while they drain)."""
    minimal = translate(inventory(BASE), OPTIONS)
    assert [(f.name, f.disabled) for f in http_manager(minimal).http_filters] == CHAIN
    policies = [
        policy("r", "rate_limit", {"maxRequests": 3, "intervalSeconds": 1}, ["r0"]),
        policy("i", "ip_filter", {"mode": "deny", "ip_list": ["10.0.0.1"]}, ["r1"]),
        policy("c", "cors", {"allowedOrigins": ["https://a.example"]}, ["r2"]),
        policy("g", "guardrails", {"direction": "request", "blockPatterns": ["x"]}, ["r2"]),
    ]
    full = translate(inventory(BASE, policies=policies), OPTIONS)
    assert full.of(LISTENER) == minimal.of(LISTENER)
    switched_on = {
        entry.name.split(":")[0]: set(entry.typed_per_filter_config)
        for table in full.of(ROUTE)
        for host in table.virtual_hosts
        for entry in host.routes
    }
    assert "envoy.filters.http.local_ratelimit" in switched_on["r0"]
    assert "envoy.filters.http.rbac" in switched_on["r1"]
    assert {
        "envoy.filters.http.cors",
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.buffer",
    } <= switched_on["r2"]


def test_ext_authz_fails_closed_with_the_neutral_body() -> None:
    manager = http_manager(translate(inventory(BASE), OPTIONS))
    ext_authz = ext_authz_pb2.ExtAuthz()
    (check,) = [f for f in manager.http_filters if f.name == "envoy.filters.http.ext_authz"]
    assert check.typed_config.Unpack(ext_authz)
    assert ext_authz.failure_mode_allow is False
    assert ext_authz.status_on_error.code == 503
    assert ext_authz.grpc_service.envoy_grpc.cluster_name == "stoa-ext-authz"
    assert ext_authz.grpc_service.timeout.ToMilliseconds() == OPTIONS.ext_authz_timeout_ms
    # The last five mappers (before them: Envoy's own decisions and the processing service's).
    mapper, authz_403, other_403, authz_400, other_400 = manager.local_reply_config.mappers[-5:]
    assert mapper.body.inline_string.encode() == DENY_BODIES[503] == DENY_BODIES[403]
    # The service's own 403 and 400 pass untouched; any other local one gets the neutral body.
    assert not authz_403.HasField("body")
    assert other_403.body.inline_string.encode() == DENY_BODIES[403]
    assert not authz_400.HasField("body")
    assert other_400.body.inline_string.encode() == DENY_BODIES[400]
    assert mapper.body_format_override.content_type == "application/json"
    (retry_after,) = mapper.headers_to_add
    assert retry_after.header.key == "retry-after"
    assert 1 <= int(retry_after.header.value) <= 10


def test_client_identity_and_override_headers_are_stripped_before_any_filter_in_any_case() -> None:
    options = TranslateOptions(extra_identity_headers=("x-legacy-user", "x-corp-*"))
    manager = http_manager(translate(inventory(BASE), options))
    (early,) = manager.early_header_mutation_extensions
    mutation = json_format.MessageToDict(early.typed_config)
    matchers = [m["removeOnMatch"]["keyMatcher"] for m in mutation["mutations"]]
    assert all(m["ignoreCase"] for m in matchers)
    prefixes = {m["prefix"] for m in matchers if "prefix" in m}
    names = {m["exact"] for m in matchers if "exact" in m}
    assert prefixes == {"x-stoa-", "x-user-", "x-auth-", "x-corp-"}
    assert {
        "x-consumer-id",
        "remote-user",
        "x-http-method-override",
        "x-rewrite-url",
        "x-legacy-user",
    } <= names


@pytest.mark.parametrize("extra", [("X-Upper",), ("bad name",), ("*",), ("a", "a")])
def test_extra_identity_headers_must_be_distinct_lower_case_names(extra: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match=r"extra_identity_headers|not a header name"):
        TranslateOptions(extra_identity_headers=extra)


def test_the_credential_is_removed_upstream_unless_forwarded_or_not_checked() -> None:
    snapshot = translate(
        inventory(
            [
                route("checked"),
                route("forwarded", forward_credential=True),
                route("open", auth_mode="none"),
            ]
        ),
        OPTIONS,
    )
    removed = {e.name.split(":")[0]: list(e.request_headers_to_remove) for e in entries(snapshot)}
    assert removed == {"checked": ["authorization"], "forwarded": [], "open": []}


def test_every_path_rule_has_its_refusal_entry() -> None:
    assert tuple(pattern for _, pattern in REFUSAL_ROUTES) == REFUSED_PATHS


@pytest.mark.parametrize(
    ("index", "path"), [(0, "/apis/r1/%252e%252e;/admin"), (1, "/apis/r1/%u002e%u002e/admin")]
)
def test_refused_paths_are_refused_first_without_a_check(index: int, path: str) -> None:
    (routes,) = translate(inventory(BASE), OPTIONS).of(ROUTE)
    refusal = routes.virtual_hosts[0].routes[index]
    assert refusal.direct_response.status == 400
    assert re.fullmatch(refusal.match.safe_regex.regex, path)
    per_route = ext_authz_pb2.ExtAuthzPerRoute()
    refusal.typed_per_filter_config["envoy.filters.http.ext_authz"].Unpack(per_route)
    assert per_route.disabled


def test_listener_hardening_defaults() -> None:
    manager = http_manager(translate(inventory(BASE), TranslateOptions(xff_num_trusted_hops=0)))
    assert manager.normalize_path.value
    assert manager.merge_slashes
    assert manager.path_with_escaped_slashes_action == hcm_pb2.HttpConnectionManager.REJECT_REQUEST
    assert manager.use_remote_address.value
    assert manager.xff_num_trusted_hops == 0
    assert manager.HasField("internal_address_config")
    # The only internal range is a documentation address no peer can have.
    assert [(r.address_prefix, r.prefix_len.value) for r in manager.internal_address_config.cidr_ranges] == [
        ("192.0.2.255", 32)
    ]
    assert manager.rds.route_config_name == "stoa-routes"
    assert manager.rds.config_source.HasField("ads")


@pytest.mark.parametrize(
    "bad",
    [
        {"listener_address": "localhost"},
        {"listener_port": 0},
        {"ext_authz_address": "127.0.0.1"},
        {"ext_authz_timeout_ms": 0},
        {"default_route_timeout_ms": 0},
        {"xff_num_trusted_hops": -1},
    ],
)
def test_bad_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        TranslateOptions(**bad)


INVALID = {
    "path prefix with a query": route("x", path_prefix="/apis/x?y"),
    "path prefix with dot segment": route("x", path_prefix="/apis/../x"),
    "relative path prefix": route("x", path_prefix="apis/x"),
    "unknown method": route("x", methods=["FETCH"]),
    "url with credentials": route("x", "http://user:pw@h:1"),
    "url with query": route("x", "http://h:1/a?b=c"),
    "url without host": route("x", "http:///a"),
    "url with bad host": route("x", "http://bad_host:1"),
    "url with port 0": route("x", "http://h:0"),
    "https url with port 0": route("x", "https://h:0/base"),
    # A zone names an interface of one machine: Envoy would refuse the whole cluster set for it.
    "ipv6 url with a zone id": route("x", "http://[fe80::1%25eth0]:8080"),
    "unknown auth mode": route("x", auth_mode="basic"),
    "empty tenant": route("x", tenant_id=""),
}


@pytest.mark.parametrize("bad_route", INVALID.values(), ids=list(INVALID))
def test_invalid_route_content_is_refused(bad_route: dict[str, object]) -> None:
    with pytest.raises(Refusal) as caught:
        translate(inventory([bad_route]), OPTIONS)
    assert caught.value.reason == FailureReason.INVALID_INVENTORY
    assert "route x" in caught.value.detail


def test_route_both_present_and_tombstoned_is_refused() -> None:
    with pytest.raises(Refusal, match="tombstoned"):
        translate(inventory(BASE, tombstones=[{"route_id": "r1", "generation": "1"}]), OPTIONS)


def test_unsupported_type_refused_before_a_duplicate_is_reported() -> None:
    policies = [
        policy("a", "rate_limit", {"maxRequests": 1, "intervalSeconds": 1}, ["r0"]),
        policy("b", "rate_limit", {"maxRequests": 1, "intervalSeconds": 1}, ["r0"]),
        policy("z", "oidc", {}, ["r0"]),
    ]
    with pytest.raises(Refusal) as caught:
        translate(inventory(BASE, policies=policies), OPTIONS)
    assert caught.value.reason == FailureReason.UNSUPPORTED_POLICY
    assert caught.value.detail == "policy z: type oidc is not supported"


def test_ten_thousand_routes_translate() -> None:
    routes = [route(f"api-{i:05d}", f"http://10.{i // 250}.{i % 250}.1:8080") for i in range(10_000)]
    snapshot = translate(inventory(routes), OPTIONS)
    assert len(entries(snapshot)) == 10_000
    assert len(snapshot.of(CLUSTER)) == 10_002  # and the two services'
    assert len(merged(snapshot.of(AUTHZ_POLICY_SET)).routes) == 10_000


ORIGINS = [
    ("https://app.example.com", "https://app.example.com", True),
    ("https://app.example.com", "https://app.example.com.evil.test", False),
    ("*", "https://anything.test", True),
    ("https://*.example.com", "https://a.example.com", True),
    ("https://*.example.com", "https://a.b.example.com", True),
    ("https://*.example.com", "https://example.com", False),
    ("https://*.example.com", "http://a.example.com", False),
    ("https://*.example.com", "https://a.example.com.evil.test", False),
    ("https://*.example.com", "https://evil.test/.example.com", False),
    ("https://*.example.com", "https://aXexample.com", False),
]


@pytest.mark.parametrize(("allowed", "origin", "matches"), ORIGINS)
def test_cors_origin_forms(allowed: str, origin: str, matches: bool) -> None:
    matcher = origin_matcher(allowed)
    if matcher.HasField("exact"):
        assert (matcher.exact == origin) is matches
    else:
        # Envoy's safe_regex must match the whole origin; these patterns mean the same in RE2 and re.
        assert (re.fullmatch(matcher.safe_regex.regex, origin) is not None) is matches


def test_opa_module_compiles_or_is_refused_naming_the_module() -> None:
    from stoa_translate.policies import ConfigError, accept_json

    module = 'package stoa\n\nallow if input.method == "GET"\n'
    assert accept_json("opa", "p1", {"module": module}) == {"module": module, "entrypoint": "data.stoa.allow"}
    with pytest.raises(ConfigError) as broken:
        accept_json("opa", "p1", {"module": "package stoa\nallow if {"})
    assert broken.value.field == "module"
    assert "does not compile" in broken.value.message
    # Rego v1 only: a rule body without `if` (v0 syntax) does not compile.
    with pytest.raises(ConfigError) as v0:
        accept_json("opa", "p1", {"module": "package stoa\nallow { true }"})
    assert (v0.value.field, "`if` keyword is required" in v0.value.message) == ("module", True)
    with pytest.raises(ConfigError) as entry:
        accept_json("opa", "p1", {"module": module, "entrypoint": "stoa.allow"})
    assert entry.value.field == "entrypoint"


SCOPED = TranslateOptions(route_scopes=True)


@pytest.mark.parametrize(
    ("prefix", "key"),
    [
        ("/apis/orders", "orders"),
        ("/apis/orders/v2", "orders"),
        ("/p/orders", "orders"),
        ("/p", None),
        ("/", None),
    ],
)
def test_a_prefix_is_keyed_by_its_second_segment(prefix: str, key: str | None) -> None:
    assert scope_key(prefix) == key


def test_route_scopes_give_each_api_key_a_scope_and_its_routes_their_keys_table() -> None:
    routes = [route(f"r{i}") for i in range(40)] + [route("v2", path_prefix="/apis/r1/v2")]
    snapshot = translate(inventory(routes), SCOPED)
    scopes = {s.key.fragments[0].string_key: s.route_configuration_name for s in snapshot.of(SCOPED_ROUTE)}
    assert set(scopes) == {f"r{i}" for i in range(40)}  # /apis/r1/v2 shares its key with /apis/r1
    tables = {t.name: t for t in snapshot.of(ROUTE) if t.name not in snapshot.on_request}
    assert set(scopes.values()) == set(tables)
    assert 1 < len(tables) <= ROUTE_TABLE_BUCKETS
    # The one table stays served, closed, for a listener built before the routes went by scope.
    assert snapshot.on_request == {ROUTE_CONFIG_NAME}
    assert snapshot.of(ROUTE)[0] is closed_table()
    assert all(name == table_name(key) for key, name in scopes.items())
    for name, table in tables.items():
        (host,) = table.virtual_hosts
        # Every table refuses the same paths first, and never lets the key header reach an upstream.
        assert [r.name for r in host.routes[: len(REFUSAL_ROUTES)]] == [n for n, _ in REFUSAL_ROUTES]
        assert SCOPE_KEY_HEADER in table.request_headers_to_remove
        for entry in host.routes[len(REFUSAL_ROUTES) :]:
            assert table_name(scope_key(entry.match.path_separated_prefix) or "") == name
    (v2_table,) = [t for t in tables.values() if any(r.name == "v2:GET" for r in t.virtual_hosts[0].routes)]
    names = [r.name for r in v2_table.virtual_hosts[0].routes]
    assert names.index("v2:GET") < names.index("r1:GET")  # the longer prefix first, as in one table
    assert http_manager(snapshot).HasField("scoped_routes")
    assert not dangling_references(snapshot)


def test_a_prefix_without_a_key_keeps_the_gateway_on_one_table() -> None:
    translator = Translator(SCOPED)
    snapshot = translator.translate(inventory([route("a"), route("root", path_prefix="/root")]))
    assert snapshot.names(ROUTE) == ["stoa-routes"]
    assert snapshot.of(ROUTE)[0] is not closed_table()
    assert not snapshot.of(SCOPED_ROUTE)
    assert http_manager(snapshot).rds.route_config_name == "stoa-routes"
    assert not snapshot.on_request
    assert translator.unkeyed == ("root",)
    translator.translate(inventory([route("a")], 2))
    assert translator.unkeyed == ()


def test_a_one_route_change_under_scopes_renders_one_table_again() -> None:
    translator = Translator(SCOPED)
    routes = [route(f"r{i}") for i in range(60)]
    before = {t.name: t for t in translator.translate(inventory(routes)).of(ROUTE)}
    edited = [dict(routes[0], methods=["GET", "POST"]), *routes[1:]]
    after = {t.name: t for t in translator.translate(inventory(edited, 2)).of(ROUTE)}
    assert before.keys() == after.keys()
    changed = [name for name in before if after[name] is not before[name]]
    assert changed == [table_name("r0")]
    # A change of the policy set alone (an issuer) leaves every table as it was.
    issuers = [{"tenant_id": "acme", "issuer": "https://idp.acme", "jwks_json": "{}"}]
    again = {t.name: t for t in translator.translate(inventory(edited, 3, issuers=issuers)).of(ROUTE)}
    assert all(again[name] is after[name] for name in after)


@pytest.mark.parametrize("options", [OPTIONS, SCOPED], ids=["one-table", "scoped"])
def test_a_translation_after_another_has_the_version_of_a_fresh_one(options: TranslateOptions) -> None:
    # The next translation reuses the serialised bytes of the objects it keeps: never a stale version.
    translator = Translator(options)
    routes = [route(f"r{i}") for i in range(30)]
    translator.translate(inventory(routes))
    edited = [dict(routes[0], methods=["GET", "POST"]), *routes[1:], route("new")]
    assert (
        translator.translate(inventory(edited, 2)).version == translate(inventory(edited, 2), options).version
    )


def _ext_proc_and_buffers(entry: route_components_pb2.Route) -> tuple[str, bool]:
    """The request-headers mode an entry's processing config asks for, and whether the buffer after
    the processor is on for it."""
    config = ext_proc_pb2.ExtProcPerRoute()
    entry.typed_per_filter_config[EXT_PROC_FILTER].Unpack(config)
    mode = ProcessingMode.HeaderSendMode.Name(config.overrides.processing_mode.request_header_mode)
    return mode, PROCESSED_BUFFER_FILTER in entry.typed_per_filter_config


def test_a_route_whose_processing_only_inspects_the_request_body_skips_the_headers_message() -> None:
    guard = {"blockPatterns": ["forbidden"], "pii": {"kinds": ["email"], "action": "block"}}
    policies = [
        # Inspected only: on the request, or on both directions.
        policy("g", "guardrails", guard, ["r0", "r2", "r3"]),
        policy("o", "guardrails", {**guard, "direction": "both"}, ["r1"]),
        # What needs the headers message keeps it for the whole route: a budget's consumer, a body a
        # redaction or a JSON edit may rewrite (an encoded one loses its content-encoding), and
        # response guardrails alone (the headers open the stream).
        policy("b", "token_budget", {"tokens": 100, "windowSeconds": 60, "per": "tenant"}, ["r2"]),
        policy("t", "transform", {"request": {"json": [{"op": "remove", "path": "/user"}]}}, ["r3"]),
        policy("r", "guardrails", {"pii": {"kinds": ["email"], "action": "redact"}}, ["r4"]),
        policy("s", "guardrails", {**guard, "direction": "response"}, ["r5"]),
    ]
    routes = [route(f"r{i}", methods=["POST"]) for i in range(6)]
    snapshot = translate(inventory(routes, policies=policies), OPTIONS)
    chosen = {entry.name.split(":")[0]: _ext_proc_and_buffers(entry) for entry in entries(snapshot)}
    assert chosen == {
        "r0": ("SKIP", True),
        "r1": ("SKIP", True),
        "r2": ("SEND", False),
        "r3": ("SEND", False),
        "r4": ("SEND", False),
        "r5": ("SEND", False),
    }
    names = [f.name for f in http_manager(snapshot).http_filters]
    assert names.index(EXT_PROC_FILTER) + 1 == names.index(PROCESSED_BUFFER_FILTER)
    # No route skips the headers message: the buffer after the processor stays on the listener, off
    # (so a route that comes to skip it changes no listener), and no route turns it on.
    none_skips = translate(inventory(routes, policies=policies[2:]), OPTIONS)
    [processed] = [f for f in http_manager(none_skips).http_filters if f.name == PROCESSED_BUFFER_FILTER]
    assert processed.disabled
    assert not any(PROCESSED_BUFFER_FILTER in entry.typed_per_filter_config for entry in entries(none_skips))
    # No processing at all: both on the listener, off, and no route turns either on.
    plain = translate(inventory(routes), OPTIONS)
    chain = {f.name: f.disabled for f in http_manager(plain).http_filters}
    assert chain[EXT_PROC_FILTER]
    assert chain[PROCESSED_BUFFER_FILTER]
    assert not any(
        {EXT_PROC_FILTER, PROCESSED_BUFFER_FILTER} & set(entry.typed_per_filter_config)
        for entry in entries(plain)
    )


def test_the_policy_set_is_served_as_default_and_route_buckets() -> None:
    issuers = [{"tenant_id": "acme", "issuer": "https://idp.acme", "jwks_json": "{}"}]
    routes = [route(f"r{i:02d}") for i in range(40)]
    resources = translate(inventory(routes, issuers=issuers), OPTIONS).of(AUTHZ_POLICY_SET)
    site, *buckets = resources
    assert (site.name, list(site.routes), [i.issuer for i in site.issuers]) == (
        "default",
        [],
        ["https://idp.acme"],
    )
    assert all(b.name == route_bucket(r.route_id) and not b.issuers for b in buckets for r in b.routes)
    assert sorted(r.route_id for b in buckets for r in b.routes) == [r["route_id"] for r in routes]
    assert 1 < len(buckets) <= POLICY_BUCKETS
    # One route more: its bucket alone is another resource, and the set's version changes.
    again = translate(inventory([*routes, route("new")], 2, issuers=issuers), OPTIONS).of(AUTHZ_POLICY_SET)
    changed = {r.name for r in again} - {r.name for r in resources} or {
        a.name for a, b in zip(again, resources, strict=True) if a.version != b.version
    }
    assert changed == {route_bucket("new")}
    assert set_version(again) != set_version(resources)
