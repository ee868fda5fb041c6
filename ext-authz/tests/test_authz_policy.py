"""Compiling a delivered policy set: what is refused (and so NACKed) and what is prepared."""

from __future__ import annotations

import json

import pytest
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from joserfc.jwk import ECKey, OctKey, OKPKey, RSAKey
from stoa_authz import ads
from stoa_authz.policy import PolicyError, PolicyStore, compile_policy_set
from stoa_ops.policy_sets import Refused, ResourceSet
from stoa_proto import authz_pb2
from stoa_translate.policy_set import merged, set_version


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
        ('{"keys": 3}', "'keys' list"),
        (json.dumps({"keys": [RSAKey.generate_key(2048).as_dict(private=True)]}), "private"),
        (json.dumps({"keys": [ECKey.generate_key("P-256").as_dict(private=True)]}), "private"),
        (json.dumps({"keys": [OKPKey.generate_key("Ed25519").as_dict(private=True)]}), "private"),
        (json.dumps({"keys": [OctKey.generate_key(256).as_dict(private=True)]}), "symmetric"),
        (json.dumps({"keys": [{"kty": "XYZ", "kid": "a"}]}), "must be one of RSA, EC, OKP"),
        (json.dumps({"keys": [{"kty": "RSA", "kid": "a", "n": "!!", "e": "AQAB"}]}), "not a usable RSA"),
        (json.dumps({"keys": [RSAKey.generate_key(1024).as_dict(private=False)]}), "shorter"),
        (json.dumps({"keys": [ECKey.generate_key("secp256k1").as_dict(private=False)]}), "curve"),
        ('{"keys": []}', "no key usable"),
        (
            json.dumps({"keys": [{**RSAKey.generate_key(2048).as_dict(private=False), "use": "enc"}]}),
            "no key usable",
        ),
        (
            json.dumps(
                {"keys": [{**RSAKey.generate_key(2048).as_dict(private=False), "key_ops": ["encrypt"]}]}
            ),
            "no key usable",
        ),
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
        "empty",
        "encryption-only",
        "key-ops-encrypt",
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


def test_a_new_version_reuses_unchanged_routes_and_parsed_keys(idp, policy):
    first = compile_policy_set(policy(idp, "r1"))
    message = policy(idp, "r2")
    message.routes[1].api_id = "open-2"
    message.routes.add(route_id="new", tenant_id="acme", api_id="new", auth_mode="jwt")
    second = compile_policy_set(message)
    assert second.routes is not first.routes  # each set has its own map; the old one is untouched
    assert set(first.routes) == {"orders", "open"}
    assert second.routes["orders"] is first.routes["orders"]
    assert (second.routes["open"].api_id, first.routes["open"].api_id) == ("open-2", "open")
    assert second.routes["new"].issuers is second.routes["orders"].issuers
    assert second.routes["new"].issuers[idp.issuer].keys is first.routes["orders"].issuers[idp.issuer].keys


def test_reuse_keeps_every_refusal(idp, policy):
    compile_policy_set(policy(idp, "k1"))
    twice = policy(idp, "k2")
    twice.routes.add().CopyFrom(twice.routes[0])  # an already compiled route, listed twice
    with pytest.raises(PolicyError, match="listed twice"):
        compile_policy_set(twice)
    broken = policy(idp, "k3")
    broken.issuers[0].jwks_json = '{"keys": 3}'  # the routes are known, the tenant's keys are not
    with pytest.raises(PolicyError, match="with a 'keys' list"):
        compile_policy_set(broken)
    again = policy(idp, "k4")
    again.issuers.add().CopyFrom(again.issuers[0])
    with pytest.raises(PolicyError, match="listed twice"):
        compile_policy_set(again)


def test_a_refreshed_issuer_is_not_carried_into_a_new_set(idp, policy):
    first = compile_policy_set(policy(idp, "f1"))
    refreshed = first.routes["orders"].issuers[idp.issuer]
    refreshed.last_refresh = 1.0  # as after an unknown kid: fetched keys join the delivered ones
    refreshed.keys = {**refreshed.keys, "fetched": refreshed.keys[idp.kid]}
    second = compile_policy_set(policy(idp, "f2"))
    issuer = second.routes["orders"].issuers[idp.issuer]
    assert issuer is not refreshed
    assert (set(issuer.keys), issuer.last_refresh) == ({idp.kid}, 0.0)
    assert second.routes["open"].issuers is second.routes["orders"].issuers


def test_tenants_trusting_the_same_issuer_keep_their_own(idp, policy):
    message = policy(idp, "s1")
    message.routes.add(route_id="other", tenant_id="globex", api_id="other", auth_mode="jwt")
    message.issuers.add().CopyFrom(message.issuers[0])
    message.issuers[1].tenant_id = "globex"
    for version in ("s1", "s2"):
        message.version = version
        compiled = compile_policy_set(message)
        acme, globex = compiled.routes["orders"].issuers, compiled.routes["other"].issuers
        assert acme is not globex
        assert acme[idp.issuer] is not globex[idp.issuer]


def split(message, version: str = "b"):
    """`message` as the Link serves it: `default` (the site-wide part) and one route bucket per route."""
    buckets = []
    for n, route in enumerate(message.routes):
        bucket = authz_pb2.AuthzPolicySet(name=f"routes-{n:03d}", version=f"{version}{n}")
        bucket.routes.add().CopyFrom(route)
        buckets.append(bucket)
    del message.routes[:]
    return message, buckets


def test_the_site_resource_and_its_route_buckets_compile_as_one_set(idp, policy):
    default, buckets = split(policy(idp, "site-1"))
    compiled = compile_policy_set(default, buckets)
    assert set(compiled.routes) == {"orders", "open"}
    assert compiled.version == set_version([default, *buckets]) not in ("site-1", "b0", "b1")
    assert set(compiled.routes["orders"].issuers[idp.issuer].keys) == {idp.kid}
    store = PolicyStore()
    store.add(compiled)
    orders = compiled.routes["orders"]
    assert store.for_route("orders", orders.version) == (compiled, orders)
    # A set without the bucket of a route does not know it: its Checks are denied, never allowed.
    without = compile_policy_set(default, buckets[1:])
    assert "orders" not in without.routes
    alone = PolicyStore()
    alone.add(without)
    assert alone.for_route("orders", orders.version) is None
    assert not alone.knows("orders")


def test_an_unchanged_bucket_is_reused_whole_and_a_changed_one_compiled(idp, policy):
    default, buckets = split(policy(idp, "reuse-1"), "r")
    first = compile_policy_set(default, buckets)
    edited = authz_pb2.AuthzPolicySet()
    edited.CopyFrom(buckets[1])
    edited.version, edited.routes[0].api_id = "r1-edited", "open-2"
    second = compile_policy_set(default, [buckets[0], edited])
    assert second.routes["orders"] is first.routes["orders"]
    assert (second.routes["open"].api_id, first.routes["open"].api_id) == ("open-2", "open")
    # Other issuers: a reused bucket's routes hold the tenant's new issuer map, not the old one.
    moved = authz_pb2.AuthzPolicySet()
    moved.CopyFrom(default)
    moved.version, moved.issuers[0].jwks_uri = "reuse-2", "https://idp.example/jwks"
    third = compile_policy_set(moved, [buckets[0], edited])
    assert third.routes["orders"].issuers is not first.routes["orders"].issuers
    assert third.routes["orders"].issuers[idp.issuer].jwks_uri == "https://idp.example/jwks"


def test_an_edited_bucket_keeps_its_unchanged_routes_after_being_reused_whole(idp, policy):
    default, buckets = split(policy(idp, "keep-1"))
    bucket = merged(buckets)
    bucket.name, bucket.version = "routes-000", "k1"
    first = compile_policy_set(default, [bucket])
    # Reused whole as often as the service remembers compilations: its routes are still known.
    for _ in range(5):
        assert compile_policy_set(default, [bucket]).routes["orders"] is first.routes["orders"]
    edited = authz_pb2.AuthzPolicySet()
    edited.CopyFrom(bucket)
    edited.version = "k2"
    edited.routes[1].api_id = "open-2"
    second = compile_policy_set(default, [edited])
    assert second.routes["orders"] is first.routes["orders"]
    assert (second.routes["open"].api_id, first.routes["open"].api_id) == ("open-2", "open")


def test_buckets_are_refused_for_what_a_set_is_refused_for(idp, policy):
    default, buckets = split(policy(idp, "dup-1"))
    twice = authz_pb2.AuthzPolicySet(name="routes-009", version="x")
    twice.routes.add().CopyFrom(buckets[0].routes[0])
    for listed in ([*buckets, twice], [*buckets, buckets[0]]):
        with pytest.raises(PolicyError, match="listed twice"):
            compile_policy_set(default, listed)
    unversioned = authz_pb2.AuthzPolicySet(name="routes-010")
    with pytest.raises(PolicyError, match="'routes-010' has no version"):
        compile_policy_set(default, [*buckets, unversioned])
    site_wide = authz_pb2.AuthzPolicySet(name="routes-011", version="y", revoked_key_sha256=["00" * 32])
    with pytest.raises(PolicyError, match="only routes belong in a route bucket"):
        compile_policy_set(default, [*buckets, site_wide])
    # A bucket reused whole is checked against the rest of the set as a compiled one is.
    compile_policy_set(default, buckets)
    with_route = authz_pb2.AuthzPolicySet()
    with_route.CopyFrom(default)
    with_route.routes.add().CopyFrom(buckets[0].routes[0])
    with pytest.raises(PolicyError, match=f"route {buckets[0].routes[0].route_id!r}: listed twice"):
        compile_policy_set(with_route, buckets)


def test_a_response_is_taken_as_its_default_and_its_buckets(idp, policy):
    default, buckets = split(policy(idp, "resp-1"))

    def response(*resources, unreadable: int | None = None):
        answer = DiscoveryResponse(type_url=ads.TYPE_URL, version_info="1")
        for resource in resources:
            answer.resources.add().Pack(resource)
        if unreadable is not None:
            answer.resources[unreadable].value = b"\xff\xff"
        return ResourceSet.of(answer)

    compiled = ads.decode(response(buckets[1], default, buckets[0]))
    assert (set(compiled.routes), compiled.version) == ({"orders", "open"}, set_version([default, *buckets]))
    # A bucket alone is not a site (it would be one with no issuers, consumers or subscriptions).
    for wrong in (response(*buckets), response(default, default, *buckets), response(buckets[0])):
        with pytest.raises(Refused, match="expected one policy set named 'default'"):
            ads.decode(wrong)
    # The site's set is the one named `default`: one left without a name is refused, even alone.
    unnamed = merged([default, *buckets])
    unnamed.name = ""
    with pytest.raises(Refused, match="expected one policy set named 'default'"):
        ads.decode(response(unnamed))
    # Resources sent again byte for byte (their decoding is reused) give the same set; an edited
    # one is decoded anew.
    first = ads._unpacked(response(default, *buckets))
    again = ads._unpacked(response(default, *buckets))
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert ads.decode(response(default, *buckets)).version == ads.decode(response(default, *buckets)).version
    edited = authz_pb2.AuthzPolicySet()
    edited.CopyFrom(buckets[1])
    edited.version, edited.routes[0].api_id = "b1-edited", "open-2"
    assert ads.decode(response(default, buckets[0], edited)).routes["open"].api_id == "open-2"
    # What cannot be decoded is refused, and revocations are read from what can be.
    with pytest.raises(Refused, match="is not an AuthzPolicySet"):
        ads.decode(response(default, *buckets, unreadable=1))
    revoking = authz_pb2.AuthzPolicySet()
    revoking.CopyFrom(default)
    revoking.revoked_key_sha256.append("ab" * 32)
    broken = response(revoking, *buckets, unreadable=1)
    assert ads.revocations(broken) == {bytes.fromhex("ab" * 32)}
    with pytest.raises(Refused, match="is not an AuthzPolicySet"):
        ads.decode(broken)
