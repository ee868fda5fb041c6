"""Where each route's decision runs, and that what Envoy gets for it is valid Envoy configuration
(what it does is held by the differential acceptance test, through a real Envoy per placement)."""

from __future__ import annotations

import json

import pytest
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from google.protobuf import json_format
from stoa_harness.envoy import validate_config
from stoa_proto import inventory_pb2
from stoa_proto.decisions import Reason
from stoa_translate import TranslateOptions, translate
from stoa_translate.decision import error_contract, placement
from stoa_translate.filters import CLAIMS_RBAC_FILTER, EXT_AUTHZ_FILTER, JWT_AUTHN_FILTER, REQUEST_RBAC_FILTER
from stoa_translate.policy_set import merged
from stoa_translate.refusal import Refusal
from stoa_translate.snapshot import AUTHZ_POLICY_SET, LISTENER, ROUTE, Snapshot
from stoa_translate.static import static_bootstrap

JWKS = json.dumps(
    {
        "keys": [
            {
                "kty": "EC",
                "crv": "P-256",
                "kid": "k1",
                "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0",
                "alg": "ES256",
                "use": "sig",
            }
        ]
    }
)
AUTO = TranslateOptions(audience="stoa", required_scopes=("platform",))


def route(rid: str, tenant: str = "acme", **fields: object) -> dict[str, object]:
    return {
        "route_id": rid,
        "tenant_id": tenant,
        "api_id": rid,
        "methods": ["GET"],
        "upstream_url": "http://127.0.0.1:8080",
        "scopes": ["orders:read"],
        **fields,
    }


def estate() -> inventory_pb2.Inventory:
    """acme ships its keys inline; globex trusts an issuer known only by its jwks_uri."""
    doc = {
        "gateway_id": "gw-1",
        "generation": "1",
        "routes": [
            route("jwt"),
            route("open", auth_mode="none", scopes=[]),
            route("sealed", envelope=True),
            route("fetched", tenant="globex"),
        ],
        "issuers": [
            {"tenant_id": "acme", "issuer": "https://idp.acme", "jwks_json": JWKS},
            {"tenant_id": "globex", "issuer": "https://idp.globex", "jwks_uri": "https://idp.globex/jwks"},
        ],
    }
    return json_format.ParseDict(doc, inventory_pb2.Inventory())


def per_route(snapshot: Snapshot) -> dict[str, dict[str, object]]:
    """Route id → its entries' typed_per_filter_config (the API routes only, not Envoy's refusals)."""
    (routes,) = snapshot.of(ROUTE)
    return {
        e.name.split(":")[0]: dict(e.typed_per_filter_config)
        for e in routes.virtual_hosts[0].routes
        if e.HasField("route")
    }


def placements(snapshot: Snapshot) -> dict[str, str]:
    configs = per_route(snapshot)
    found = {}
    for rid, config in configs.items():
        left_out = route_components_pb2.FilterConfig()
        if config[EXT_AUTHZ_FILTER].Unpack(left_out):  # type: ignore[attr-defined]
            assert left_out == placement.NO_CHECK
            found[rid] = placement.ENVOY
        elif JWT_AUTHN_FILTER in config:
            found[rid] = placement.SERVICE_VERIFIED_TOKEN
        else:
            found[rid] = placement.SERVICE
    return found


def test_each_route_is_decided_at_the_cheapest_place_that_enforces_it() -> None:
    snapshot = translate(estate(), AUTO)
    assert placements(snapshot) == {
        "jwt": placement.ENVOY,
        "open": placement.ENVOY,
        "sealed": placement.SERVICE_VERIFIED_TOKEN,
        "fetched": placement.SERVICE,
    }
    policy_set = merged(snapshot.of(AUTHZ_POLICY_SET))
    flags = {r.route_id: (r.verified_by_envoy, r.envelope) for r in policy_set.routes}
    assert flags == {
        "jwt": (False, False),
        "open": (False, False),
        "sealed": (True, True),
        "fetched": (False, False),
    }


@pytest.mark.parametrize(
    "options",
    [TranslateOptions(audience="stoa", decision_placement="service"), TranslateOptions()],
    ids=["placement-service", "no-audience"],
)
def test_without_native_placement_every_route_goes_to_the_service(options: TranslateOptions) -> None:
    snapshot = translate(estate(), options)
    assert set(placements(snapshot).values()) == {placement.SERVICE}
    (listener,) = snapshot.of(LISTENER)
    manager = hcm.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    # The filters stand on the listener, off; Envoy verifies no token and no route switches them on.
    (verifier,) = [f for f in manager.http_filters if f.name == JWT_AUTHN_FILTER]
    config = jwt_pb2.JwtAuthentication()
    assert verifier.typed_config.Unpack(config)
    assert verifier.disabled
    assert not config.providers
    envoy_filters = {JWT_AUTHN_FILTER, CLAIMS_RBAC_FILTER, REQUEST_RBAC_FILTER}
    for table in snapshot.of(ROUTE):
        for entry in table.virtual_hosts[0].routes:
            assert not envoy_filters & set(entry.typed_per_filter_config)
    assert not manager.access_log


def test_the_filters_stand_in_the_one_order() -> None:
    (listener,) = translate(estate(), AUTO).of(LISTENER)
    manager = hcm.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    names = [f.name for f in manager.http_filters]
    assert names.index(REQUEST_RBAC_FILTER) < names.index(JWT_AUTHN_FILTER) < names.index(CLAIMS_RBAC_FILTER)
    assert names.index(CLAIMS_RBAC_FILTER) < names.index(EXT_AUTHZ_FILTER)


def test_an_envelope_needs_a_token() -> None:
    inventory = estate()
    inventory.routes[1].envelope = True
    with pytest.raises(Refusal, match="envelope"):
        translate(inventory, AUTO)


def test_every_native_denial_has_a_reason_and_nothing_else_does() -> None:
    for details, reason in error_contract.EXACT.items():
        assert error_contract.reason_of(details) is reason
    assert error_contract.reason_of("jwt_authn_access_denied{Jwt_verification_fails}") is Reason.INVALID_TOKEN
    for other in ("via_upstream", "rbac_access_denied_matched_policy[none]", "ext_authz_denied", ""):
        assert error_contract.reason_of(other) is None


def test_native_configuration_is_valid_for_envoy() -> None:
    options = TranslateOptions(
        audience="stoa", required_scopes=("platform",), decision_log_cluster="stoa-ads"
    )
    bootstrap = static_bootstrap({"native": (translate(estate(), options), 20100)})
    # The access log goes to the Link's ADS cluster, which the real bootstrap defines.
    bootstrap["static_resources"]["clusters"].append(
        {
            "name": "stoa-ads",
            "type": "STATIC",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            },
            "load_assignment": {
                "cluster_name": "stoa-ads",
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {"address": "127.0.0.1", "port_value": 18000}
                                    }
                                }
                            }
                        ]
                    }
                ],
            },
        }
    )
    validate_config(bootstrap)


def _claims_rules(snapshot: Snapshot, route_id: str) -> str:
    return json_format.MessageToJson(_unpacked(per_route(snapshot)[route_id][CLAIMS_RBAC_FILTER]))


def _unpacked(config: object) -> object:
    message = rbac_pb2.RBACPerRoute()
    assert config.Unpack(message)  # type: ignore[attr-defined]
    return message


def test_a_verified_token_is_checked_again_against_the_tenants_issuers_and_keys_now() -> None:
    """jwt_authn's keys live on the listener, which an open connection may hold from before an
    issuer or key was removed: the routes whose token Envoy verifies name the issuers and key ids
    of now, and a removal gives those routes new rules."""
    inventory = estate()
    two_keys = json.dumps({"keys": [{**json.loads(JWKS)["keys"][0], "kid": k} for k in ("k-old", "k-new")]})
    inventory.issuers[0].jwks_json = two_keys
    before = translate(inventory, AUTO)
    for route_id in ("jwt", "sealed"):  # decided by Envoy; by the service on Envoy's verification
        rules = _claims_rules(before, route_id)
        assert all(text in rules for text in ("https://idp.acme", "k-old", "k-new"))
    assert CLAIMS_RBAC_FILTER not in per_route(before)["fetched"]  # the service verifies that one
    inventory.issuers[0].jwks_json = json.dumps({"keys": [json.loads(two_keys)["keys"][1]]})
    after = translate(inventory, AUTO)
    rules = _claims_rules(after, "jwt")
    assert "k-new" in rules
    assert "k-old" not in rules
