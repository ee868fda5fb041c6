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
from stoa_harness.idp import DevIdentityProvider


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
