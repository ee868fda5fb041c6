"""The dev identity provider over real HTTP: discovery, JWKS, the token endpoint, rotation, and the
deliberately bad tokens (each one fails verification the way its name says)."""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest
from joserfc import jwt
from joserfc.errors import BadSignatureError, JoseError
from joserfc.jwk import KeySet
from stoa_harness.idp import DevIdentityProvider, s256


@pytest.fixture(scope="module")
def idp():
    with DevIdentityProvider(alg="ES256", audience="stoa-demo") as provider:
        yield provider


def header(token: str) -> dict:
    head = token.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))


def verify(idp, token: str) -> dict:
    keys = KeySet.import_key_set(httpx.get(idp.jwks_uri).json())
    return jwt.decode(token, keys, algorithms=["ES256"]).claims


def test_discovery_and_token_endpoint(idp):
    discovery = httpx.get(f"{idp.base_url}/.well-known/openid-configuration").json()
    assert discovery["issuer"] == idp.base_url
    assert discovery["jwks_uri"] == idp.jwks_uri
    reply = httpx.post(
        discovery["token_endpoint"],
        data={
            "grant_type": "client_credentials",
            "tenant": "acme",
            "scope": "a b",
            "sub": "svc-1",
            "audience": "other",
        },
    )
    assert reply.status_code == 200
    body = reply.json()
    assert body["token_type"] == "Bearer"
    claims = verify(idp, body["access_token"])
    assert (claims["iss"], claims["tenant_id"], claims["scope"], claims["sub"], claims["aud"]) == (
        idp.base_url,
        "acme",
        "a b",
        "svc-1",
        "other",
    )
    assert claims["exp"] > time.time()


def test_token_endpoint_refuses_other_grants(idp):
    reply = httpx.post(idp.token_url, data={"grant_type": "password"})
    assert reply.status_code == 400
    assert reply.json()["error"] == "unsupported_grant_type"


@pytest.mark.parametrize(
    "form",
    [
        {"tenant": "acme"},
        [("grant_type", "client_credentials"), ("tenant", "acme"), ("tenant", "other")],
        [("grant_type", "password"), ("grant_type", "client_credentials")],
    ],
    ids=["no-grant-type", "repeated-tenant", "repeated-grant-type"],
)
def test_token_endpoint_refuses_missing_or_repeated_parameters(idp, form):
    reply = (
        httpx.post(idp.token_url, data=form)
        if isinstance(form, dict)
        else httpx.post(
            idp.token_url,
            content="&".join(f"{k}={v}" for k, v in form),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
    )
    assert reply.status_code == 400
    assert reply.json()["error"] == "invalid_request"


def test_rotation_publishes_new_kid_and_keeps_old(idp):
    before = idp.mint()
    old_kid = idp.kid
    new_kid = idp.rotate()
    assert new_kid != old_kid
    after = idp.mint()
    assert header(after)["kid"] == new_kid
    kids = {k["kid"] for k in httpx.get(idp.jwks_uri).json()["keys"]}
    assert kids == {old_kid, new_kid}
    assert verify(idp, before)["iss"] == verify(idp, after)["iss"]


def test_bad_tokens_are_bad_in_the_named_way(idp):
    now = time.time()
    assert verify(idp, idp.expired())["exp"] < now
    assert verify(idp, idp.not_yet_valid())["nbf"] > now
    assert verify(idp, idp.wrong_audience())["aud"] != idp.audience
    assert header(idp.alg_none())["alg"] == "none"
    assert header(idp.hs256_with_public_key())["alg"] == "HS256"
    with pytest.raises(BadSignatureError):
        verify(idp, idp.bad_signature())
    with pytest.raises(JoseError):
        verify(idp, idp.other_issuer())
    for token in (idp.alg_none(), idp.hs256_with_public_key()):
        with pytest.raises(JoseError):
            verify(idp, token)


@pytest.mark.parametrize(
    ("form", "roles", "tenant"),
    [
        ({"role": "platform_admin"}, ["platform_admin"], None),
        ({"role": "tenant_admin", "tenant": "acme"}, ["tenant_admin"], "acme"),
        ({"role": "viewer"}, ["viewer"], None),
        ({"role": "viewer", "tenant": "acme"}, ["viewer"], "acme"),
    ],
)
def test_token_endpoint_mints_a_control_plane_token_per_role(idp, form, roles, tenant):
    reply = httpx.post(idp.token_url, data={"grant_type": "client_credentials", **form})
    assert reply.status_code == 200, reply.text
    claims = verify(idp, reply.json()["access_token"])
    assert claims["stoa_roles"] == roles
    assert claims.get("tenant_id") == tenant
    assert claims["aud"] == "stoa-cp"


@pytest.mark.parametrize("form", [{"role": "tenant_admin"}, {"role": "owner"}], ids=["no-tenant", "unknown"])
def test_token_endpoint_refuses_a_role_it_cannot_mint(idp, form):
    reply = httpx.post(idp.token_url, data={"grant_type": "client_credentials", **form})
    assert reply.status_code == 400
    assert reply.json()["error"] == "invalid_request"


# ---- sign-in: authorization code + PKCE ----------------------------------------------------------
REDIRECT = "http://127.0.0.1:8080/console/callback"
VERIFIER = "v" * 20 + "-._~" + "0123456789abcdefghijk"


def authorize_params(**overrides: str) -> dict:
    params = {
        "response_type": "code",
        "client_id": "stoa-console",
        "redirect_uri": REDIRECT,
        "state": "s-123",
        "code_challenge": s256(VERIFIER),
        "code_challenge_method": "S256",
    }
    params.update(overrides)
    return {k: v for k, v in params.items() if v is not None}


def sign_in(idp, username: str, password: str, **overrides: str) -> httpx.Response:
    return httpx.post(
        idp.authorize_url, data={**authorize_params(**overrides), "username": username, "password": password}
    )


def code_of(reply: httpx.Response) -> str:
    assert reply.status_code == 303, reply.text
    location = httpx.URL(reply.headers["location"])
    assert str(location).startswith(REDIRECT + "?")
    assert location.params["state"] == "s-123"
    return location.params["code"]


def redeem(idp, code: str, verifier: str = VERIFIER, redirect_uri: str = REDIRECT) -> httpx.Response:
    return httpx.post(
        idp.token_url,
        data={
            "grant_type": "authorization_code",
            "code": code,
            "client_id": "stoa-console",
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        },
    )


def test_discovery_names_the_authorization_endpoint_and_s256(idp):
    discovery = httpx.get(f"{idp.base_url}/.well-known/openid-configuration").json()
    assert discovery["authorization_endpoint"] == idp.authorize_url
    assert discovery["code_challenge_methods_supported"] == ["S256"]
    assert "authorization_code" in discovery["grant_types_supported"]


@pytest.mark.parametrize(
    ("user", "roles", "tenant"), [("admin", ["platform_admin"], None), ("alice", ["tenant_admin"], "demo")]
)
def test_a_dev_user_signs_in_with_a_code_and_its_verifier(idp, user, roles, tenant):
    page = httpx.get(idp.authorize_url, params=authorize_params())
    assert page.status_code == 200
    assert 'name="password"' in page.text
    assert '<label for="username">' in page.text
    reply = redeem(idp, code_of(sign_in(idp, user, user)))
    assert reply.status_code == 200, reply.text
    assert reply.headers["cache-control"] == "no-store"
    claims = verify(idp, reply.json()["access_token"])
    assert (claims["sub"], claims["stoa_roles"], claims.get("tenant_id"), claims["aud"]) == (
        user,
        roles,
        tenant,
        "stoa-cp",
    )


def test_a_code_is_used_up_by_any_attempt_and_bound_to_its_verifier_and_redirect(idp):
    code = code_of(sign_in(idp, "alice", "alice"))
    assert redeem(idp, code, verifier="w" * 43).json() == {"error": "invalid_grant"}
    assert redeem(idp, code).json() == {"error": "invalid_grant"}  # used up by the failed attempt
    other = code_of(sign_in(idp, "alice", "alice"))
    assert redeem(idp, other, redirect_uri="http://127.0.0.1:9/console/callback").status_code == 400
    fresh = code_of(sign_in(idp, "alice", "alice"))
    assert redeem(idp, fresh).status_code == 200
    assert redeem(idp, fresh).json() == {"error": "invalid_grant"}  # once only


def test_a_wrong_password_shows_the_form_again_with_the_error(idp):
    reply = sign_in(idp, "alice", "admin")
    assert reply.status_code == 401
    assert 'role="alert"' in reply.text
    assert "location" not in reply.headers
    assert sign_in(idp, "mallory", "mallory").status_code == 401


@pytest.mark.parametrize(
    "redirect_uri",
    [
        "https://evil.example/console/callback",
        "http://127.0.0.1:8080/elsewhere",
        "http://10.0.0.1/console/callback",
    ],
)
def test_an_unregistered_redirect_uri_is_never_redirected_to(idp, redirect_uri):
    for reply in (
        httpx.get(idp.authorize_url, params=authorize_params(redirect_uri=redirect_uri)),
        sign_in(idp, "alice", "alice", redirect_uri=redirect_uri),
    ):
        assert reply.status_code == 400
        assert "location" not in reply.headers
    assert httpx.get(idp.authorize_url, params=authorize_params(client_id="other")).status_code == 400


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"code_challenge": None}, "invalid_request"),
        ({"code_challenge_method": "plain"}, "invalid_request"),
        ({"response_type": "token"}, "unsupported_response_type"),
    ],
    ids=["no-challenge", "plain", "implicit"],
)
def test_a_request_without_s256_pkce_goes_back_with_its_error(idp, overrides, error):
    reply = httpx.get(idp.authorize_url, params=authorize_params(**overrides))
    assert reply.status_code == 303
    location = httpx.URL(reply.headers["location"])
    assert (location.params["error"], location.params["state"]) == (error, "s-123")
    assert "code" not in location.params


def test_browsers_on_loopback_origins_may_redeem_and_others_may_not(idp):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    allowed = httpx.options(idp.token_url, headers={"Origin": "http://127.0.0.1:8080", **preflight})
    assert allowed.headers["access-control-allow-origin"] == "http://127.0.0.1:8080"
    refused = httpx.options(idp.token_url, headers={"Origin": "https://evil.example", **preflight})
    assert "access-control-allow-origin" not in refused.headers
