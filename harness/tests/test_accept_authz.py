"""The authorization service through a real Envoy: tokens, tenants, scopes, identity headers,
malformed requests and the decision log. CP + Link + Envoy + stoa-authz + dev IdP."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest
from joserfc import jws
from joserfc.jwk import import_key
from stoa_harness import raw_http
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.upstream import Arrival
from stoa_harness.wait import wait_until
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES

AUDIENCE = "stoa-accept"
PATH = "/apis/orders/items"
OPEN = {"mode": "none", "scopes": []}
# This site's upstreams also trust these (a Link setting): stripped like the defaults.
SITE_IDENTITY_HEADERS = "x-legacy-user,x-corp-*"


@pytest.fixture(scope="module")
def estate(idp: DevIdentityProvider, estates: Callable[..., Estate]) -> Estate:
    options = EstateOptions(
        authz="service",
        authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE},
        # This module is about the service itself: every route through it (the differential test holds
        # the native placement to the same answers).
        link_env={
            "STOA_LINK_EXTRA_IDENTITY_HEADERS": SITE_IDENTITY_HEADERS,
            "STOA_LINK_DECISION_PLACEMENT": "service",
        },
    )
    running = estates(options, "estate-authz")
    running.admin.create_tenant("demo", exist_ok=True)
    running.admin.create_tenant("other", exist_ok=True)
    running.admin.add_issuer("demo", idp.issuer, idp.jwks_uri)
    up = running.upstream.url
    running.publish(
        "orders", tenant_id="demo", auth={"mode": "jwt", "scopes": ["orders:read"], "envelope": True}
    )
    running.publish("open", tenant_id="demo", auth=OPEN)
    running.publish(
        "forwarding",
        tenant_id="demo",
        auth={"mode": "jwt", "scopes": ["orders:read"], "forward_credential": True},
    )
    # An open API and a token-protected one side by side on one backend host.
    running.publish("pub", tenant_id="demo", path_prefix="/p/pub", upstream_url=f"{up}/pub", auth=OPEN)
    running.admin.wait_synced(
        running.publish(
            "admin",
            tenant_id="demo",
            path_prefix="/p/admin",
            upstream_url=f"{up}/admin",
            auth={"mode": "jwt", "scopes": ["orders:read"]},
        )
    )
    running.started_site.wait_authz_ready()
    return running


def get(
    estate: Estate,
    token: str | None = None,
    path: str = PATH,
    headers: Sequence[tuple[str, str]] = (),
) -> httpx.Response:
    sent = list(headers)
    if token is not None:
        sent.append(("authorization", f"Bearer {token}"))
    return estate.gateway.get(estate.url(path), headers=sent)


def good(**claims: Any) -> dict[str, Any]:
    return {"tenant": "demo", "scope": "orders:read", **claims}


def test_no_token_is_401_and_never_reaches_upstream(estate: Estate) -> None:
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
def test_bad_tokens_are_401(estate: Estate, idp: DevIdentityProvider, kind: str) -> None:
    estate.upstream.clear()
    reply = get(estate, getattr(idp, kind)(**good()))
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert estate.upstream.arrivals() == []


def identity_claims(estate: Estate, arrival: Arrival) -> dict[str, Any]:
    """The claims of the identity envelope the upstream received, its signature checked with the
    service's published key."""
    jwks = httpx.get(f"{estate.started_site.authz_http_url}/.well-known/jwks.json").json()
    envelope = jws.deserialize_compact(
        arrival.header("x-stoa-identity"), import_key(jwks["keys"][0]), algorithms=["EdDSA"]
    )
    return json.loads(envelope.payload)


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        pytest.param({"tenant": "other", "scope": "orders:read"}, "tenant_mismatch", id="other-tenant"),
        pytest.param({"tenant": "demo", "scope": "orders:write"}, "insufficient_scope", id="missing-scope"),
    ],
)
def test_other_tenant_and_missing_scope_are_403(
    estate: Estate, idp: DevIdentityProvider, claims: dict[str, Any], reason: str
) -> None:
    estate.upstream.clear()
    reply = get(estate, idp.mint(**claims))
    assert reply.status_code == 403
    assert reply.headers["www-authenticate"] == 'Bearer error="insufficient_scope"'
    assert reply.content == DENY_BODIES[403]
    assert estate.upstream.arrivals() == []
    assert estate.last_authz_reason() == reason


def test_scp_list_is_accepted(estate: Estate, idp: DevIdentityProvider) -> None:
    estate.upstream.clear()
    reply = get(estate, idp.mint(tenant="demo", scope=None, scp=["orders:read"], sub="scp-client"))
    assert reply.status_code == 200, reply.text
    [arrival] = estate.upstream.arrivals()
    assert arrival.header("x-stoa-tenant-id") == "demo"
    assert arrival.header("x-stoa-subject") == "scp-client"
    assert "orders:read" in identity_claims(estate, arrival)["scopes"]
    # The list is what was read: the same list without the route's scope is refused.
    refused = get(estate, idp.mint(tenant="demo", scope=None, scp=["orders:write"]))
    assert refused.status_code == 403
    assert estate.last_authz_reason() == "insufficient_scope"
    assert len(estate.upstream.arrivals()) == 1


def test_allowed_request_carries_gateway_identity_only(estate: Estate, idp: DevIdentityProvider) -> None:
    estate.upstream.clear()
    forged = [
        ("X-Stoa-Tenant-Id", "evil"),
        ("X-USER-ID", "root"),
        ("x-Tenant-Id", "evil"),
        ("x-stoa-subject", "x"),
    ]
    reply = get(estate, idp.mint(**good(sub="client-1")), headers=forged)
    assert reply.status_code == 200, reply.text
    [arrival] = estate.upstream.arrivals()
    assert arrival.header("x-stoa-tenant-id") == "demo"
    assert arrival.header("x-stoa-api-id") == "orders"
    assert arrival.header("x-stoa-subject") == "client-1"
    assert arrival.header("x-user-id") is None
    assert arrival.header("x-tenant-id") is None
    claims = identity_claims(estate, arrival)
    assert (claims["tenant"], claims["api"], claims["sub"]) == ("demo", "orders", "client-1")


def test_auth_none_route_needs_no_token_but_strips(estate: Estate) -> None:
    estate.upstream.clear()
    reply = get(estate, path="/apis/open/x", headers=[("X-User-Id", "root")])
    assert reply.status_code == 200
    [arrival] = estate.upstream.arrivals()
    assert arrival.header("x-stoa-tenant-id") == "demo"
    assert arrival.header("x-user-id") is None


@pytest.mark.parametrize(
    "claims",
    [
        pytest.param({"sub": "client\r\nx-stoa-tenant-id: other"}, id="sub-crlf"),
        pytest.param({"sub": "client\nx"}, id="sub-lf"),
        pytest.param({"sub": "client\rx"}, id="sub-cr"),
        pytest.param({"sub": "client\x00x"}, id="sub-nul"),
        # Trimmed by every HTTP parser: " admin" would reach the upstream as "admin".
        pytest.param({"sub": " admin"}, id="sub-leading-space"),
        # Read as Latin-1 by most servers: another identity.
        pytest.param({"sub": "client-\u00e9"}, id="sub-not-ascii"),
        pytest.param({"sub": None}, id="no-sub"),
        pytest.param({"lifetime_s": 86_400 + 300}, id="lifetime-above-24h"),
        pytest.param({"iat": None, "lifetime_s": 86_400 + 300}, id="no-iat-expiring-beyond-24h"),
    ],
)
def test_validly_signed_but_unusable_token_is_401_invalid_token(
    estate: Estate, idp: DevIdentityProvider, claims: dict[str, Any]
) -> None:
    estate.upstream.clear()
    reply = get(estate, idp.mint(**good(**claims)))
    assert reply.status_code == 401, reply.text
    assert reply.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert estate.upstream.arrivals() == []


def test_duplicate_authorization_is_400(estate: Estate, idp: DevIdentityProvider) -> None:
    estate.upstream.clear()
    token = idp.mint(**good())
    reply = estate.gateway.get(
        estate.url(PATH), headers=[("authorization", f"Bearer {token}"), ("authorization", f"Bearer {token}")]
    )
    assert reply.status_code == 400
    assert reply.content == DENY_BODIES[400]
    assert estate.upstream.arrivals() == []
    assert estate.last_authz_reason() == "malformed_request"
    # The same token once is allowed: the duplicate is what was refused.
    assert get(estate, token).status_code == 200


def test_decision_log_has_one_event_per_request_and_no_secrets(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    decisions = estate.started_site.authz_decisions

    before = len(decisions())
    estate.upstream.clear()
    token = idp.mint(tenant="demo", scope="orders:read", sub="subject-unique-4711")
    assert get(estate, token).status_code == 200
    assert get(estate).status_code == 401
    new = wait_until(
        lambda: decisions()[before:] if len(decisions()) >= before + 2 else None, 10, "two events"
    )
    assert [e["reason"] for e in new] == ["allowed", "missing_token"]
    # The event and the envelope carry the request id the upstream sees (not Envoy's stream id).
    [arrival] = estate.upstream.arrivals()
    identity = arrival.header("x-stoa-identity").split(".")[1]
    envelope_claims = json.loads(base64.urlsafe_b64decode(identity + "=" * (-len(identity) % 4)))
    assert new[0]["request_id"] == envelope_claims["request_id"] == arrival.header("x-request-id")
    for path in estate.run_dir.glob("*.log"):
        text = path.read_text(errors="replace")
        assert token not in text, path
        assert "subject-unique-4711" not in text, path


def test_key_rotation_passes_after_the_cp_ships_the_new_jwks(estate: Estate) -> None:
    """Airtight: the rotating provider is stopped before any token with its new kid is used, so the
    site can only know the new key from the inventory the CP shipped."""
    with DevIdentityProvider(alg="ES256", audience=AUDIENCE) as rotating:
        created = estate.admin.add_issuer("demo", rotating.issuer, rotating.jwks_uri)
        estate.admin.wait_synced()
        assert get(estate, rotating.mint(**good())).status_code == 200
        old_kid = rotating.kid
        new_kid = rotating.rotate()
        assert new_kid != old_kid
        token = rotating.mint(**good())
        refreshed = estate.admin.refresh_issuer("demo", created["issuer_id"])
        assert refreshed["changed"] is True
        estate.admin.wait_synced()
        jwks_uri = rotating.jwks_uri
    with pytest.raises(httpx.ConnectError):
        httpx.get(jwks_uri, timeout=2)
    # The CP shipped the new key in the inventory (the site need not reach the IdP).
    shipped = [i for i in estate.inventory()["issuers"] if i["issuer"] == rotating.issuer]
    assert new_kid in json.dumps(shipped)
    assert get(estate, token).status_code == 200


# -- what never reaches an upstream from a client -------------------------------------------------
FOREIGN_IDENTITY = [
    ("X-Consumer-ID", "admin"),
    ("x-consumer-username", "admin"),
    ("X-Consumer-Custom-Id", "admin"),
    ("X-Credential-Identifier", "admin-key"),
    ("X-Anonymous-Consumer", "false"),
    ("X-Remote-User", "admin"),
    ("X-Forwarded-User", "admin"),
    ("X-Auth-Request-User", "admin"),
    ("X-Auth-Request-Email", "admin@example.com"),
    ("Remote-User", "admin"),
    ("X-Stoa-Tenant-Id", "other"),
    ("X-USER-ID", "root"),
    ("x-tenant-id", "other"),
    ("X-Legacy-User", "admin"),  # added by this site
    ("X-Corp-Role", "admin"),  # added by this site, as a prefix
]
OVERRIDES = [
    ("X-HTTP-Method-Override", "DELETE"),
    ("X-Http-Method", "DELETE"),
    ("X-Method-Override", "DELETE"),
    ("X-Original-URL", "/admin/x"),
    ("X-Rewrite-URL", "/admin/x"),
]


def raw_get(estate: Estate, target: str, headers: Sequence[tuple[str, str]] = ()) -> raw_http.Reply:
    return raw_http.send(estate.gateway_url, "GET", target, headers)


@pytest.mark.parametrize("route", ["jwt", "none"])
def test_foreign_identity_and_override_headers_never_reach_the_upstream(
    estate: Estate, idp: DevIdentityProvider, route: str
) -> None:
    estate.upstream.clear()
    sent = FOREIGN_IDENTITY + OVERRIDES + [("X-Note", "kept")]
    if route == "jwt":
        sent.append(("authorization", f"Bearer {idp.mint(**good(sub='client-1'))}"))
    reply = raw_get(estate, "/apis/orders/x" if route == "jwt" else "/apis/open/x", sent)

    assert reply.status == 200, reply.body
    [arrival] = estate.upstream.arrivals()
    assert arrival.method == "GET"
    assert arrival.header("x-note") == "kept"  # the headers were sent; only these were removed
    for name, _ in FOREIGN_IDENTITY + OVERRIDES:
        if name.lower() != "x-stoa-tenant-id":
            assert arrival.header(name) is None, name
    assert arrival.header("x-stoa-tenant-id") == "demo"  # set by the decision, never the client's


def test_an_upstream_never_sees_the_checked_token_unless_the_api_forwards_it(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    token = idp.mint(**good())
    seen = {}
    for path in ("/apis/orders/x", "/apis/forwarding/x", "/apis/open/x"):
        estate.upstream.clear()
        assert get(estate, token, path=path).status_code == 200
        [arrival] = estate.upstream.arrivals()
        seen[path.split("/")[2]] = arrival.header("authorization")

    # Checked and not forwarded: removed. Forwarded: as sent. Open API: nothing was consumed.
    assert seen == {"orders": None, "forwarding": f"Bearer {token}", "open": f"Bearer {token}"}


@pytest.mark.parametrize(
    "target",
    [
        "/p/pub/%2e%2e;/admin/x",
        "/p/pub/%2E%2E;/admin/x",
        "/p/pub/%2e%2e;jsessionid=1/admin/x",
        "/p/pub/.%2e;/admin/x",
        "/p/pub/%2e%2e%3b/admin/x",
        "/p/pub/%252e%252e;/admin/x",
        "/p/pub/%252e%252e/admin/x",
        "/p/pub/%%32%65%%32%65;/admin/x",
        # Escapes that are not percent-encoded UTF-8, decoded by lax servers (IIS's %u, overlong UTF-8).
        "/p/pub/%u002e%u002e/admin/x",
        "/p/pub/%U002E%U002E;/admin/x",
        "/p/pub/%c0%ae%c0%ae/admin/x",
        "/p/pub/%e0%80%ae%e0%80%ae/admin/x",
        "/p/pub/x%c0%af..%c0%afadmin/x",
        "/p/pub/%25u002e%25u002e/admin/x",
    ],
)
def test_a_hidden_dot_segment_into_a_protected_api_is_400_and_never_reaches_the_upstream(
    estate: Estate, target: str
) -> None:
    estate.upstream.clear()
    reply = raw_get(estate, target)
    assert reply.status == 400
    assert reply.body == DENY_BODIES[400]
    assert reply.headers["content-type"] == CONTENT_TYPE
    assert estate.upstream.arrivals() == []


def test_dot_segments_envoy_resolves_and_matrix_parameters_reach_one_path(estate: Estate) -> None:
    estate.upstream.clear()
    # Resolved by Envoy before routing: the protected API decides it (no token: 401).
    assert raw_get(estate, "/p/pub/..;/admin/x").status == 401
    assert raw_get(estate, "/p/pub/%2e%2e/admin/x").status == 401
    reply = raw_get(estate, "/p/pub/a;v=1/b")
    assert reply.status == 200
    [arrival] = estate.upstream.arrivals()
    assert arrival.path == "/pub/a;v=1/b"


def test_a_folded_header_is_one_header_and_smuggles_no_identity(estate: Estate) -> None:
    estate.upstream.clear()
    port = estate.gateway_url.rsplit(":", 1)[1]
    request = (
        f"GET /apis/open/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "X-Note: a\r\n X-Consumer-Id: admin\r\n"
        "X-Other: b\r\n\tX-Stoa-Tenant-Id: other\r\n"
        "X-Remote-User: admin\r\n continued\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    reply = raw_http.send_bytes(estate.gateway_url, request)

    assert reply.status == 200
    [arrival] = estate.upstream.arrivals()
    # Each fold became part of the header above it, on one line: no header of its own.
    assert arrival.header("x-note") == "a X-Consumer-Id: admin"
    assert arrival.header("x-other") == "b\tX-Stoa-Tenant-Id: other"
    assert arrival.header("x-consumer-id") is None
    assert arrival.header("x-remote-user") is None
    assert arrival.header("x-stoa-tenant-id") == "demo"
