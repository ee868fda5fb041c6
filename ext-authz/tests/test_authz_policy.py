"""Compiling a delivered policy set: what is refused (and so NACKed) and what is prepared."""

from __future__ import annotations

import json

import pytest
from joserfc.jwk import ECKey, OctKey, OKPKey, RSAKey
from stoa_authz.policy import PolicyError, PolicyStore, compile_policy_set


def with_jwks(policy, idp, jwks_json: str):
    message = policy(idp)
    message.issuers[0].jwks_json = jwks_json
    return message


def test_prepares_routes_keys_and_scopes(idp, policy):
    compiled = compile_policy_set(policy(idp))
    orders = compiled.routes["orders"]
    assert orders.scopes == frozenset({"orders:read"})
    assert not orders.auth_none
    assert compiled.routes["open"].auth_none
    assert set(orders.issuers[idp.issuer].keys) == {idp.kid}
    assert "RS256" in orders.issuers[idp.issuer].keys[idp.kid].algorithms


@pytest.mark.parametrize(
    ("jwks_json", "message"),
    [
        ("{not json", "not JSON"),
        ('{"keys": 3}', "no 'keys' list"),
        (json.dumps({"keys": [RSAKey.generate_key(2048).as_dict(private=True)]}), "private"),
        (json.dumps({"keys": [ECKey.generate_key("P-256").as_dict(private=True)]}), "private"),
        (json.dumps({"keys": [OKPKey.generate_key("Ed25519").as_dict(private=True)]}), "private"),
        (json.dumps({"keys": [OctKey.generate_key(256).as_dict(private=True)]}), "symmetric"),
        (json.dumps({"keys": [{"kty": "XYZ", "kid": "a"}]}), "unsupported key type"),
        (json.dumps({"keys": [{"kty": "RSA", "kid": "a", "n": "!!", "e": "AQAB"}]}), "does not parse"),
        (json.dumps({"keys": [RSAKey.generate_key(1024).as_dict(private=False)]}), "shorter"),
        (json.dumps({"keys": [ECKey.generate_key("secp256k1").as_dict(private=False)]}), "curve"),
    ],
    ids=[
        "not-json",
        "no-keys",
        "rsa-private",
        "ec-private",
        "okp-private",
        "oct",
        "kty",
        "bad-modulus",
        "short-rsa",
        "curve",
    ],
)
def test_unusable_jwks_is_refused(idp, policy, jwks_json, message):
    with pytest.raises(PolicyError, match=message):
        compile_policy_set(with_jwks(policy, idp, jwks_json))


def test_refuses_missing_version_bad_mode_and_duplicates(idp, policy):
    message = policy(idp)
    message.version = ""
    with pytest.raises(PolicyError, match="no version"):
        compile_policy_set(message)
    message = policy(idp)
    message.routes[0].auth_mode = "basic"
    with pytest.raises(PolicyError, match="auth mode"):
        compile_policy_set(message)
    message = policy(idp)
    message.routes.add().CopyFrom(message.routes[0])
    with pytest.raises(PolicyError, match="listed twice"):
        compile_policy_set(message)


def test_store_keeps_last_versions(idp, policy):
    store = PolicyStore(keep=2)
    for version in ("v1", "v2", "v3"):
        store.add(compile_policy_set(policy(idp, version)))
    assert store.versions() == ["v2", "v3"]
    assert store.get("v1") is None
    warm = store.get("v2")
    store.add(compile_policy_set(policy(idp, "v2")))
    assert store.get("v2") is warm  # same content re-delivered keeps its token cache
    assert store.versions() == ["v3", "v2"]
