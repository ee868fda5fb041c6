"""The authorization service through a real Envoy: tokens, tenants, scopes, identity headers,
malformed requests and the decision log (issue 4). CP + Link + Envoy + stoa-authz + dev IdP."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from joserfc import jws
from joserfc.jwk import import_key
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import wait_until

AUDIENCE = "stoa-accept"
PATH = "/apis/orders/items"


@pytest.fixture(scope="module")
def idp() -> Iterator[DevIdentityProvider]:
    with DevIdentityProvider(alg="RS256", audience=AUDIENCE) as provider:
        yield provider


@pytest.fixture(scope="module")
def estate(postgres: EmbeddedPostgres, tmp_path_factory, idp) -> Iterator[Estate]:
    options = EstateOptions(authz="service", authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE})
    with Estate(options, postgres=postgres, run_dir=tmp_path_factory.mktemp("estate-authz")) as running:
        running.ensure_tenant("demo")
        running.ensure_tenant("other")
        reply = running.admin.post(
            "/v1/tenants/demo/issuers", json={"issuer": idp.issuer, "jwks_uri": idp.jwks_uri}
        )
        assert reply.status_code == 201, reply.text
        running.wait_synced(
            running.publish("orders", tenant_id="demo", auth={"mode": "jwt", "scopes": ["orders:read"]})
        )
        running.wait_synced(running.publish("open", tenant_id="demo", auth={"mode": "none", "scopes": []}))
        authz_ready = f"{running.site.authz_http_url}/health/ready"
        wait_until(lambda: httpx.get(authz_ready).status_code == 200, 30, "stoa-authz ready")
        yield running


def get(estate: Estate, token: str | None = None, path: str = PATH, headers=None) -> httpx.Response:
    sent = list(headers or [])
    if token is not None:
        sent.append(("authorization", f"Bearer {token}"))
    return estate.gateway.get(estate.url(path), headers=sent)


def good(idp: DevIdentityProvider, **claims) -> dict:
    return {"tenant": "demo", "scope": "orders:read", **claims}


def test_no_token_is_401_and_never_reaches_upstream(estate):
    estate.upstream.clear()
    reply = get(estate)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    assert reply.headers["content-type"] == "application/json"
    assert estate.upstream.arrivals() == []


@pytest.mark.parametrize(
    "kind",
    [
        "bad_signature",
        "alg_none",
        "hs256_with_public_key",
        "expired",
        "not_yet_valid",
        "other_issuer",
        "wrong_audience",
    ],
)
def test_bad_tokens_are_401(estate, idp, kind):
    estate.upstream.clear()
    reply = get(estate, getattr(idp, kind)(**good(idp)))
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert estate.upstream.arrivals() == []


def test_other_tenant_and_missing_scope_are_403(estate, idp):
    for token in (
        idp.mint(tenant="other", scope="orders:read"),
        idp.mint(tenant="demo", scope="orders:write"),
    ):
        reply = get(estate, token)
        assert reply.status_code == 403
        assert reply.headers["www-authenticate"] == 'Bearer error="insufficient_scope"'


def test_scp_list_is_accepted(estate, idp):
    assert get(estate, idp.mint(tenant="demo", scope=None, scp=["orders:read"])).status_code == 200


def test_allowed_request_carries_gateway_identity_only(estate, idp):
    estate.upstream.clear()
    forged = [
        ("X-Stoa-Tenant-Id", "evil"),
        ("X-USER-ID", "root"),
        ("x-Tenant-Id", "evil"),
        ("x-stoa-subject", "x"),
    ]
    reply = get(estate, idp.mint(**good(idp, sub="client-1")), headers=forged)
    assert reply.status_code == 200, reply.text
    [arrival] = estate.upstream.arrivals()
    assert arrival.header("x-stoa-tenant-id") == "demo"
    assert arrival.header("x-stoa-api-id") == "orders"
    assert arrival.header("x-stoa-subject") == "client-1"
    assert arrival.header("x-user-id") is None
    assert arrival.header("x-tenant-id") is None
    jwks = httpx.get(f"{estate.site.authz_http_url}/.well-known/jwks.json").json()
    envelope = jws.deserialize_compact(
        arrival.header("x-stoa-identity"), import_key(jwks["keys"][0]), algorithms=["EdDSA"]
    )
    claims = json.loads(envelope.payload)
    assert (claims["tenant"], claims["api"], claims["sub"]) == ("demo", "orders", "client-1")


def test_auth_none_route_needs_no_token_but_strips(estate):
    estate.upstream.clear()
    reply = get(estate, path="/apis/open/x", headers=[("X-User-Id", "root")])
    assert reply.status_code == 200
    [arrival] = estate.upstream.arrivals()
    assert arrival.header("x-stoa-tenant-id") == "demo"
    assert arrival.header("x-user-id") is None


def test_duplicate_authorization_is_400(estate, idp):
    token = idp.mint(**good(idp))
    reply = estate.gateway.get(
        estate.url(PATH), headers=[("authorization", f"Bearer {token}"), ("authorization", f"Bearer {token}")]
    )
    assert reply.status_code == 400


def test_decision_log_has_one_event_per_request_and_no_secrets(estate, idp):
    log_path = estate.site.authz.log_path

    def decisions() -> list[dict]:
        lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
        return [e for e in lines if e.get("event") == "ext_authz_decision"]

    before = len(decisions())
    token = idp.mint(tenant="demo", scope="orders:read", sub="subject-unique-4711")
    assert get(estate, token).status_code == 200
    assert get(estate).status_code == 401
    new = wait_until(
        lambda: decisions()[before:] if len(decisions()) >= before + 2 else None, 10, "two events"
    )
    assert [e["reason"] for e in new] == ["allowed", "missing_token"]
    for path in estate.run_dir.glob("*.log"):
        text = path.read_text(errors="replace")
        assert token not in text, path
        assert "subject-unique-4711" not in text, path


def test_key_rotation_passes_after_the_cp_ships_the_new_jwks(estate):
    """Airtight: the rotating provider is stopped before any token with its new kid is used, so the
    site can only know the new key from the inventory the CP shipped."""
    with DevIdentityProvider(alg="ES256", audience=AUDIENCE) as rotating:
        created = estate.admin.post(
            "/v1/tenants/demo/issuers", json={"issuer": rotating.issuer, "jwks_uri": rotating.jwks_uri}
        )
        assert created.status_code == 201, created.text
        estate.wait_synced()
        assert get(estate, rotating.mint(**good(rotating))).status_code == 200
        old_kid = rotating.kid
        new_kid = rotating.rotate()
        assert new_kid != old_kid
        token = rotating.mint(**good(rotating))
        refreshed = estate.admin.post(f"/v1/tenants/demo/issuers/{created.json()['issuer_id']}/refresh")
        assert refreshed.is_success, refreshed.text
        assert refreshed.json()["changed"] is True
        estate.wait_synced()
        jwks_uri = rotating.jwks_uri
    with pytest.raises(httpx.ConnectError):
        httpx.get(jwks_uri, timeout=2)
    # The CP shipped the new key in the inventory (the site need not reach the IdP).
    shipped = [i for i in estate.inventory()["issuers"] if i["issuer"] == rotating.issuer]
    assert new_kid in json.dumps(shipped)
    assert get(estate, token).status_code == 200
