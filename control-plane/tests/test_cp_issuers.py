"""Trusted issuers: JWKS validation, fetch of a jwks_uri from a loopback server, refresh (on demand and
in the background) and the generation bumps a key change causes."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator

import pytest
from joserfc.jwk import ECKey, OKPKey, RSAKey
from stoa_harness.asgi_thread import Receive, Scope, Send, ThreadedASGIServer
from stoa_harness.wait import wait_until_async


def public_jwk(kid: str) -> dict:
    key = OKPKey.generate_key("Ed25519")
    return {**key.as_dict(private=False), "kid": kid}


def weak_rsa_jwk() -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # joserfc warns about generating a short key
        return RSAKey.generate_key(1024).as_dict(private=False)


def p521_jwk() -> dict:
    return ECKey.generate_key("P-521").as_dict(private=False)


class JwksServer:
    """Loopback JWKS endpoint whose document (or failure) a test sets."""

    def __init__(self) -> None:
        self.document: object = {"keys": [public_jwk("k1")]}
        self.status = 200
        self.http = ThreadedASGIServer(self._app, "jwks").start()
        self.url = f"{self.http.url}/jwks.json"

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = json.dumps(self.document).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def close(self) -> None:
        self.http.stop()


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    server = JwksServer()
    yield server
    server.close()


@pytest.fixture
async def tenant_on_gateway(api) -> tuple[str, str, str]:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    await api.deploy(await api.new_api(tenant_id), gateway_id)
    return tenant_id, gateway_id, credential


async def test_issuer_from_jwks_uri_is_fetched_shipped_and_refreshed(
    api, jwks_server, tenant_on_gateway
) -> None:
    tenant_id, gateway_id, credential = tenant_on_gateway
    idle_gateway, _ = await api.new_gateway()
    before = await api.generation(gateway_id)
    issuer = "http://127.0.0.1/idp"
    created = await api.answer(
        "POST", f"/v1/tenants/{tenant_id}/issuers", json={"issuer": issuer, "jwks_uri": jwks_server.url}
    )
    assert created.status_code == 201, created.text
    issuer_id = created.json()["issuer_id"]
    assert created.json()["jwks"] == jwks_server.document
    assert await api.generation(gateway_id) == before + 1
    assert await api.generation(idle_gateway) == 1

    inv = await api.inventory(gateway_id, credential=credential)
    assert [(i["tenant_id"], i["issuer"], i["jwks_uri"]) for i in inv["issuers"]] == [
        (tenant_id, issuer, jwks_server.url)
    ]
    assert json.loads(inv["issuers"][0]["jwks_json"]) == jwks_server.document

    # Same keys: refresh changes nothing.
    same = await api.answer("POST", f"/v1/tenants/{tenant_id}/issuers/{issuer_id}/refresh")
    assert same.status_code == 200
    assert same.json()["changed"] is False
    assert await api.generation(gateway_id) == before + 1

    # The IdP rotates: refresh ships the new keys in one new generation.
    jwks_server.document = {"keys": [public_jwk("k2"), jwks_server.document["keys"][0]]}
    rotated = await api.answer("POST", f"/v1/tenants/{tenant_id}/issuers/{issuer_id}/refresh")
    assert rotated.status_code == 200
    assert rotated.json()["changed"] is True
    assert await api.generation(gateway_id) == before + 2
    inv = await api.inventory(gateway_id, credential=credential)
    assert [k["kid"] for k in json.loads(inv["issuers"][0]["jwks_json"])["keys"]] == ["k2", "k1"]

    # The IdP fails: 502 naming jwks_uri, previous keys stay in force.
    jwks_server.status = 500
    failed = await api.answer("POST", f"/v1/tenants/{tenant_id}/issuers/{issuer_id}/refresh")
    assert failed.status_code == 502
    assert failed.json()["errors"][0]["field"] == "jwks_uri"
    assert await api.generation(gateway_id) == before + 2
    listed = (await api.answer("GET", f"/v1/tenants/{tenant_id}/issuers")).json()
    assert [k["kid"] for k in listed[0]["jwks"]["keys"]] == ["k2", "k1"]
    assert "500" in listed[0]["last_error"]

    assert (await api.answer("DELETE", f"/v1/tenants/{tenant_id}/issuers/{issuer_id}")).status_code == 204
    assert await api.generation(gateway_id) == before + 3
    assert (await api.inventory(gateway_id, credential=credential))["issuers"] == []


async def test_inline_jwks_and_duplicates(api, tenant_on_gateway) -> None:
    tenant_id, _, _ = tenant_on_gateway
    rsa = {**RSAKey.generate_key(2048).as_dict(private=False), "kid": "r1"}
    ec = {**ECKey.generate_key("P-256").as_dict(private=False), "kid": "e1"}
    body = {"issuer": "https://idp.example.com", "jwks": {"keys": [rsa, ec]}}
    created = await api.answer("POST", f"/v1/tenants/{tenant_id}/issuers", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["jwks_uri"] is None
    repeated = await api.answer("POST", f"/v1/tenants/{tenant_id}/issuers", json=body)
    assert repeated.status_code == 200, repeated.text
    assert repeated.json()["issuer_id"] == created.json()["issuer_id"]
    dup = await api.answer("POST", f"/v1/tenants/{tenant_id}/issuers", json={**body, "jwks": {"keys": [rsa]}})
    assert dup.status_code == 409
    assert dup.json()["errors"][0]["field"] == "issuer"
    no_uri = await api.answer(
        "POST", f"/v1/tenants/{tenant_id}/issuers/{created.json()['issuer_id']}/refresh"
    )
    assert no_uri.status_code == 409
    assert no_uri.json()["errors"][0]["field"] == "jwks_uri"


def _private_rsa() -> dict:
    return {**RSAKey.generate_key(2048).as_dict(private=True), "kid": "p1"}


BAD_ISSUERS = [
    ({"issuer": "https://i.example", "jwks": {"keys": [_private_rsa()]}}, "jwks.keys[0].d"),
    (
        {"issuer": "https://i.example", "jwks": {"keys": [{"kty": "oct", "kid": "s", "k": "c2VjcmV0"}]}},
        "jwks.keys[0].kty",
    ),
    (
        {"issuer": "https://i.example", "jwks": {"keys": [{**public_jwk("a"), "kid": ""}]}},
        "jwks.keys[0].kid",
    ),
    # What the authorization service would refuse (and so once made the gateway FAILED).
    (
        {"issuer": "https://i.example", "jwks": {"keys": [{**weak_rsa_jwk(), "kid": "rsa1024"}]}},
        "jwks.keys[0]",
    ),
    (
        {"issuer": "https://i.example", "jwks": {"keys": [{**p521_jwk(), "kid": "p521"}]}},
        "jwks.keys[0].crv",
    ),
    (
        {"issuer": "https://i.example", "jwks": {"keys": [{"kty": "RSA", "kid": "x", "n": "!!"}]}},
        "jwks.keys[0]",
    ),
    ({"issuer": "https://i.example", "jwks": {"keys": []}}, "jwks.keys"),
    (
        {"issuer": "https://i.example", "jwks": {"keys": [public_jwk("a"), public_jwk("a")]}},
        "jwks.keys[1].kid",
    ),
    ({"issuer": "https://i.example"}, "jwks_uri"),
    (
        {"issuer": "https://i.example", "jwks": {"keys": [public_jwk("a")]}, "jwks_uri": "https://x/j"},
        "jwks_uri",
    ),
    ({"issuer": "not-a-url", "jwks": {"keys": [public_jwk("a")]}}, "issuer"),
    ({"issuer": "https://i.example", "jwks_uri": "ftp://x/j"}, "jwks_uri"),
    ({"issuer": "https://i.example", "jwks_uri": "https://user:s3cret@idp.example/j"}, "jwks_uri"),
    ({"issuer": "https://i\u0000.example", "jwks": {"keys": [public_jwk("a")]}}, "issuer"),
    ({"issuer": "https://i.example", "jwks": {"keys": [{**public_jwk("a"), "x5u": "\u0000"}]}}, "jwks"),
]


@pytest.mark.parametrize(("body", "field"), BAD_ISSUERS)
async def test_bad_issuer_is_422_naming_the_field_and_stores_nothing(
    api, tenant_on_gateway, body, field
) -> None:
    tenant_id, gateway_id, _ = tenant_on_gateway
    before = await api.generation(gateway_id)
    response = await api.answer("POST", f"/v1/tenants/{tenant_id}/issuers", json=body)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]
    assert "s3cret" not in response.text
    assert (await api.answer("GET", f"/v1/tenants/{tenant_id}/issuers")).json() == []
    assert await api.generation(gateway_id) == before


@pytest.mark.parametrize("failure", ["http_404", "not_json", "private_key", "unreachable"])
async def test_unusable_jwks_uri_is_502_and_stores_nothing(
    api, jwks_server, tenant_on_gateway, failure
) -> None:
    tenant_id, gateway_id, _ = tenant_on_gateway
    url = jwks_server.url
    if failure == "http_404":
        jwks_server.status = 404
    elif failure == "not_json":
        jwks_server.document = "<html>"
    elif failure == "private_key":
        jwks_server.document = {"keys": [_private_rsa()]}
    else:
        jwks_server.close()
    before = await api.generation(gateway_id)
    response = await api.answer(
        "POST", f"/v1/tenants/{tenant_id}/issuers", json={"issuer": "https://i.example", "jwks_uri": url}
    )
    # The identity provider failed, not the caller.
    assert response.status_code == 502, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["jwks_uri"]
    assert (await api.answer("GET", f"/v1/tenants/{tenant_id}/issuers")).json() == []
    assert await api.generation(gateway_id) == before


async def test_background_refresh_ships_rotated_keys(cp_factory, api, jwks_server) -> None:
    fast = await cp_factory(jwks_refresh_s=0.2)
    async with fast.client(gateway_id="gw-rot") as admin:
        await admin.create_tenant("rot", "R")
        gateway = await admin.create_gateway("gw-rot", "G")
        await admin.create_api("rot-api", tenant_id="rot", name="x", upstream_url="http://127.0.0.1:9")
        await admin.deploy("rot-api")
        await admin.add_issuer("rot", "http://127.0.0.1/rot", jwks_server.url)

        async def generation() -> int:
            return int((await admin.gateway())["generation"])

        settled = await generation()
        assert settled == 3
        jwks_server.document = {"keys": [public_jwk("rotated")]}

        async def bumped() -> bool:
            return await generation() == settled + 1

        await wait_until_async(bumped, 10, "the background refresh to publish the rotated keys")
        async with fast.client(gateway["credential"], gateway_id="gw-rot") as link:
            inv = await link.inventory()
        assert [k["kid"] for k in json.loads(inv["issuers"][0]["jwks_json"])["keys"]] == ["rotated"]

        # Unchanged keys on later rounds publish nothing new.
        async def refreshed_again() -> bool:
            listed = await admin.issuers("rot")
            return listed[0]["fetched_at"] != fetched_at

        fetched_at = (await admin.issuers("rot"))[0]["fetched_at"]
        await wait_until_async(refreshed_again, 10, "another background refresh round")
        assert await generation() == settled + 1


async def test_a_refreshed_key_set_the_site_would_refuse_is_not_adopted(api, tenant_on_gateway, jwks_server):
    tenant_id, gateway_id, _ = tenant_on_gateway
    good = {"keys": [public_jwk("good")]}
    jwks_server.document = good
    issuer = await api.answer(
        "POST",
        f"/v1/tenants/{tenant_id}/issuers",
        json={"issuer": "https://rot.example", "jwks_uri": jwks_server.url},
    )
    assert issuer.status_code == 201, issuer.text
    issuer_id = issuer.json()["issuer_id"]
    before = await api.generation(gateway_id)
    for weak in ({**weak_rsa_jwk(), "kid": "rsa1024"}, {**p521_jwk(), "kid": "p521"}):
        jwks_server.document = {"keys": [public_jwk("good"), weak]}
        refreshed = await api.answer("POST", f"/v1/tenants/{tenant_id}/issuers/{issuer_id}/refresh")
        assert refreshed.status_code == 502, refreshed.text
        (listed,) = (await api.answer("GET", f"/v1/tenants/{tenant_id}/issuers")).json()
        assert listed["jwks"] == good  # the previous keys stay in force
        assert weak["kid"] not in json.dumps(listed["jwks"])
        assert "keys[1]" in listed["last_error"]
        assert await api.generation(gateway_id) == before
