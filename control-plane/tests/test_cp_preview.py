"""The translation preview: the Link's translator on the gateway's desired state, with the settings
the Link last reported (the defaults before any), and `envoy --mode validate` on request."""

from __future__ import annotations

import json

from google.protobuf import json_format
from stoa_cp import preview
from stoa_harness.cp_client import fresh_id
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_translate import TranslateOptions, translate
from stoa_translate.snapshot import AUTHZ_POLICY_SET, LISTENER

REPORTED = {
    "listener_address": "127.0.0.1",
    "listener_port": 18123,
    "ext_authz_address": "127.0.0.1:19191",
    "ext_authz_timeout_ms": 300,
    "default_route_timeout_ms": 15000,
    "extra_identity_headers": ["x-site-user"],
}


async def deployed_gateway(api) -> tuple[str, str]:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    api_id = await api.new_api(tenant_id, methods=["GET", "POST"])
    await api.deploy(api_id, gateway_id)
    cors = {"allowedOrigins": ["https://a.example"], "allowedMethods": ["get"]}
    await api.create_policy(fresh_id("p"), "cors", cors, tenant_id=tenant_id, scope="tenant")
    return gateway_id, credential


def expected(inventory: dict, options: TranslateOptions) -> str:
    return translate(json_format.ParseDict(inventory, inventory_pb2.Inventory()), options).version


async def test_preview_is_the_translation_with_defaults_then_with_the_reported_settings(api, cp) -> None:
    gateway_id, credential = await deployed_gateway(api)
    inventory = await api.inventory(gateway_id, credential=credential)

    before = (await api.answer("GET", f"/v1/gateways/{gateway_id}/preview")).json()
    assert before["settings_reported"] is False
    assert before["settings"]["listener_port"] == TranslateOptions().listener_port
    assert before["refusal"] is None
    assert before["generation"] == int(inventory["generation"])
    assert before["snapshot_version"] == expected(inventory, TranslateOptions())
    assert AUTHZ_POLICY_SET in before["policy_sets"]
    assert len(before["resources"][LISTENER]) == 1

    report = {
        "gateway_id": gateway_id,
        "generation": inventory["generation"],
        "status": "SYNCED",
        "snapshot_version": "v",
        "settings": REPORTED,
    }
    async with cp.client(credential) as link:
        assert (
            await link.answer("POST", f"/v1/gateways/{gateway_id}/sync-reports", json=report)
        ).status_code == 202
    after = (await api.answer("GET", f"/v1/gateways/{gateway_id}/preview")).json()
    assert after["settings_reported"] is True
    options = TranslateOptions.from_settings(
        json_format.ParseDict(REPORTED, inventory_pb2.TranslateSettings())
    )
    assert after["snapshot_version"] == expected(inventory, options)
    (listener,) = after["resources"][LISTENER]
    assert listener["address"]["socket_address"]["port_value"] == 18123


async def test_validate_envoy_runs_envoy_or_is_503_without_one(api, cp_factory) -> None:
    gateway_id, _ = await deployed_gateway(api)
    validated = await api.answer("GET", f"/v1/gateways/{gateway_id}/preview", params={"validate": "envoy"})
    assert validated.status_code == 200, validated.text
    assert validated.json()["validation"] == {"valid": True, "detail": ""}

    without = await cp_factory(envoy_binary="/nonexistent/envoy")
    async with without.client() as client, without.client() as admin:
        await client.create_gateway("gw-no-envoy", "G")
        refused = await admin.answer("GET", "/v1/gateways/gw-no-envoy/preview", params={"validate": "envoy"})
        assert refused.status_code == 503, refused.text
        assert refused.json()["errors"][0]["field"] == "validate"
        # Without validation the preview needs no Envoy.
        assert (await admin.answer("GET", "/v1/gateways/gw-no-envoy/preview")).status_code == 200


def test_a_refused_inventory_previews_as_the_refusal_the_link_would_report() -> None:
    # From an older or newer CP than this translator: a kind it does not support.
    document = {
        "schema_version": INVENTORY_SCHEMA_VERSION,
        "gateway_id": "gw",
        "generation": "3",
        "policies": [{"policy_id": "p1", "type": "oidc"}],
    }
    rendered, snapshot = preview.render("gw", json.dumps(document), None)
    assert snapshot is None
    assert rendered.refusal is not None
    assert (rendered.refusal.reason, rendered.refusal.detail) == (
        "UNSUPPORTED_POLICY",
        "policy p1: type oidc is not supported",
    )
    assert rendered.resources == {}
