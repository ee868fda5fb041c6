"""Consumers through a real Envoy, the real Link and the real `stoa-authz`: API keys allowed,
refused and revoked (revocation timed, and kept when its generation is NACKed), never read from the
query string nor passed upstream nor logged; subscriptions missing or suspended; a token's consumer
by its OAuth client; identity headers forged by the client never reach the upstream."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import asyncpg
import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc import jws
from joserfc.jwk import import_key
from stoa_harness.cp_client import CPError
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.upstream import Arrival
from stoa_harness.wait import wait_until
from stoa_proto.bodies import DENY_BODIES

AUDIENCE = "stoa-consumers"
TENANT = "shop"
KEYED = "/apis/catalog/items"
SUBSCRIBED = "/apis/basket/items"
# The bound on a revocation or a suspension reaching requests through Envoy.
PROPAGATION_S = 2.0
# Rego v1 on the gateway-neutral input: true, false, a string, or undefined by the query's `mode`.
RULES = """package stoa

decision := true if input.query.mode == ["allow"]

decision := false if input.query.mode == ["deny"]

decision := "yes" if input.query.mode == ["string"]

decision := true if {
    input.query.mode == ["who"]
    input.identity.consumer == "acme"
    input.identity.tenant == "shop"
    input.api == {"id": "ruled", "tenant": "shop"}
    input.method == "GET"
    input.path_segments == ["apis", "ruled", "x"]
    input.headers["x-trace"] == "t1"
    not input.headers["x-api-key"]
    not input.headers["x-stoa-consumer-id"]
}

decision := true if {
    input.query.mode == ["token"]
    input.identity.tenant == "shop"
    input.identity.subject == "alice"
    input.identity.scopes == ["a:read", "b:write"]
    input.identity.consumer == "acme"
    input.api.id == "ruled-jwt"
    not input.headers.authorization
}
"""


@pytest.fixture(scope="module")
def idp() -> Iterator[DevIdentityProvider]:
    with DevIdentityProvider(alg="ES256", audience=AUDIENCE) as provider:
        yield provider


@pytest.fixture(scope="module")
def estate(idp: DevIdentityProvider, estates: Callable[..., Estate]) -> Estate:
    running = estates(
        EstateOptions(authz="service", authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE}), "estate-consumers"
    )
    admin = running.admin
    admin.create_tenant(TENANT, exist_ok=True)
    admin.add_issuer(TENANT, idp.issuer, jwks=idp.jwks())
    running.publish("catalog", tenant_id=TENANT, auth={"mode": "api_key", "envelope": True})
    running.publish("basket", tenant_id=TENANT, auth={"mode": "jwt", "subscription": True, "envelope": True})
    admin.create_plan("free", tenant_id=TENANT, requests=1000, window_seconds=60)
    for consumer, client in (("acme", "acme-app"), ("idle", "idle-app")):
        admin.create_consumer(consumer, tenant_id=TENANT, client_ids=[client])
    admin.subscribe("acme-catalog", tenant_id=TENANT, consumer_id="acme", api_id="catalog", plan_id="free")
    admin.subscribe("acme-basket", tenant_id=TENANT, consumer_id="acme", api_id="basket", plan_id="free")
    running.publish("ruled", tenant_id=TENANT, auth={"mode": "api_key"})
    running.publish("ruled-jwt", tenant_id=TENANT, auth={"mode": "jwt"})
    admin.subscribe("acme-ruled", tenant_id=TENANT, consumer_id="acme", api_id="ruled", plan_id="free")
    admin.create_policy(
        "ruled-opa",
        "opa",
        {"module": RULES, "entrypoint": "data.stoa.decision"},
        tenant_id=TENANT,
        targets=["ruled", "ruled-jwt"],
    )
    admin.wait_synced()
    running.started_site.wait_authz_ready()
    return running


def new_key(estate: Estate, consumer: str = "acme") -> dict[str, Any]:
    created = estate.admin.create_key(consumer, tenant_id=TENANT)
    estate.admin.wait_synced()
    return dict(created)


def get(
    estate: Estate, path: str, headers: Sequence[tuple[str, str]] = (), query: str = ""
) -> httpx.Response:
    return estate.gateway.get(estate.url(path) + query, headers=list(headers))


def envelope(estate: Estate, arrival: Arrival) -> dict[str, Any]:
    jwks = httpx.get(f"{estate.started_site.authz_http_url}/.well-known/jwks.json").json()
    token = jws.deserialize_compact(
        arrival.header("x-stoa-identity"), import_key(jwks["keys"][0]), algorithms=["EdDSA"]
    )
    return json.loads(token.payload)


def first_refusal(estate: Estate, request: Callable[[], httpx.Response], status: int) -> float:
    """Seconds from now until `request` is answered `status` through Envoy (at most PROPAGATION_S)."""
    started = time.monotonic()
    wait_until(lambda: request().status_code == status, PROPAGATION_S, f"a {status} through Envoy")
    return time.monotonic() - started


def test_key_allows_with_consumer_identity_and_never_reaches_upstream(estate: Estate) -> None:
    key = new_key(estate)["key"]
    estate.upstream.clear()
    forged = [("X-Stoa-Consumer-Id", "mallory"), ("x-consumer-id", "mallory"), ("X-Stoa-Tenant-Id", "evil")]
    reply = get(estate, KEYED, [("x-api-key", key), *forged])
    assert reply.status_code == 200, reply.text
    [arrival] = estate.upstream.arrivals()
    assert arrival.header("x-stoa-consumer-id") == "acme"
    assert arrival.header("x-stoa-tenant-id") == TENANT
    assert arrival.header("x-consumer-id") is None
    assert arrival.header("x-api-key") is None
    assert key not in json.dumps(dict(arrival.headers))
    claims = envelope(estate, arrival)
    assert (claims["consumer"], claims["subscription"], claims["tenant"]) == ("acme", "acme-catalog", TENANT)
    assert estate.last_authz_reason() == "allowed"


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        pytest.param([], "", id="no-key"),
        pytest.param([("x-api-key", "stoa_000000000000_not-a-key")], "", id="unknown-key"),
        pytest.param([("authorization", "Bearer {key}")], "", id="key-as-bearer"),
        pytest.param([], "?x-api-key={key}&api_key={key}", id="key-in-query"),
    ],
)
def test_missing_or_unknown_key_is_401_without_challenge(
    estate: Estate, headers: list[tuple[str, str]], query: str
) -> None:
    key = new_key(estate)["key"]
    estate.upstream.clear()
    reply = get(estate, KEYED, [(n, v.format(key=key)) for n, v in headers], query.format(key=key))
    assert reply.status_code == 401
    assert "www-authenticate" not in reply.headers
    assert reply.content == DENY_BODIES[401]
    assert estate.upstream.arrivals() == []
    assert estate.last_authz_reason() == "invalid_key"


def test_key_without_subscription_is_403(estate: Estate) -> None:
    key = new_key(estate, "idle")["key"]
    estate.upstream.clear()
    reply = get(estate, KEYED, [("x-api-key", key)])
    assert reply.status_code == 403
    assert reply.content == DENY_BODIES[403]
    assert estate.upstream.arrivals() == []
    assert estate.last_authz_reason() == "no_subscription"


def test_revoked_key_stops_within_bound_and_is_never_logged(estate: Estate) -> None:
    created = new_key(estate)
    ask = lambda: get(estate, KEYED, [("x-api-key", created["key"])])  # noqa: E731
    assert ask().status_code == 200
    estate.admin.revoke_key("acme", created["key_id"], tenant_id=TENANT)
    took = first_refusal(estate, ask, 401)
    print(f"revocation propagation: {took * 1000:.0f} ms")
    estate.admin.wait_synced()
    assert ask().status_code == 401
    assert estate.last_authz_reason() == "invalid_key"
    for path in estate.run_dir.rglob("*.log"):
        assert created["key"] not in path.read_text(errors="replace"), path


def test_suspended_subscription_is_403_within_bound_and_back_when_active(estate: Estate) -> None:
    key = new_key(estate)["key"]
    ask = lambda: get(estate, KEYED, [("x-api-key", key)])  # noqa: E731
    assert ask().status_code == 200
    estate.admin.set_subscription_state("acme-catalog", "suspended", tenant_id=TENANT)
    try:
        first_refusal(estate, ask, 403)
        assert estate.last_authz_reason() == "no_subscription"
    finally:
        estate.admin.set_subscription_state("acme-catalog", "active", tenant_id=TENANT)
    first_refusal(estate, ask, 200)


def test_token_consumer_needs_an_active_subscription(estate: Estate, idp: DevIdentityProvider) -> None:
    estate.upstream.clear()
    acme = idp.mint(tenant=TENANT, azp="acme-app", sub="alice")
    reply = get(estate, SUBSCRIBED, [("authorization", f"Bearer {acme}"), ("x-stoa-consumer-id", "idle")])
    assert reply.status_code == 200, reply.text
    [arrival] = estate.upstream.arrivals()
    assert (arrival.header("x-stoa-consumer-id"), arrival.header("x-stoa-subject")) == ("acme", "alice")
    assert envelope(estate, arrival)["subscription"] == "acme-basket"
    for token in (
        idp.mint(tenant=TENANT, azp="idle-app"),  # a consumer without a subscription to this API
        idp.mint(tenant=TENANT, client_id="unknown-app"),  # a client that is no consumer's
        idp.mint(tenant=TENANT),  # no client at all
    ):
        refused = get(estate, SUBSCRIBED, [("authorization", f"Bearer {token}")])
        assert refused.status_code == 403
        assert estate.last_authz_reason() == "no_subscription"
    assert len(estate.upstream.arrivals()) == 1


def weak_rsa_jwks() -> dict[str, Any]:
    """A well-formed RSA public key the service refuses (1024 bits < 2048)."""
    numbers = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key().public_numbers()

    def b64(value: int) -> str:
        raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return {"keys": [{"kty": "RSA", "kid": "weak-1", "use": "sig", "n": b64(numbers.n), "e": b64(numbers.e)}]}


async def store_issuer_unchecked(database_url: str, issuer: str) -> None:
    """An issuer written past the CP's rules, as one stored before them would be."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO issuers (issuer_id, tenant_id, issuer, jwks) VALUES ($1, $2, $3, $4::jsonb)",
            "iss-weak-consumers",
            TENANT,
            issuer,
            json.dumps(weak_rsa_jwks()),
        )
    finally:
        await conn.close()


def failed_on(estate: Estate, generation: int) -> dict[str, Any]:
    """The gateway's last report once it is FAILED on `generation`."""
    return wait_until(
        lambda: (
            s["last_report"]
            if (s := estate.admin.status())["state"] == "FAILED"
            and s["last_report"]["generation"] == generation
            else None
        ),
        30,
        f"the gateway FAILED on generation {generation}",
    )


def revocations_kept(estate: Estate) -> int:
    return len(estate.started_site.link_events("revocations_kept"))


def test_revocation_in_a_nacked_generation_still_applies(estate: Estate) -> None:
    created = new_key(estate)
    ask = lambda: get(estate, KEYED, [("x-api-key", created["key"])])  # noqa: E731
    assert ask().status_code == 200
    kept_before = revocations_kept(estate)
    # The generation carrying the revocation also carries a key set the service refuses: NACKed.
    asyncio.run(store_issuer_unchecked(estate.database_url, "https://weak.consumers.example"))
    estate.admin.revoke_key("acme", created["key_id"], tenant_id=TENANT)
    generation = estate.admin.desired_generation()
    try:
        assert failed_on(estate, generation)["reason"] == "NACK"
        # The service keeps the revocation of the set it refused, and the Link serves the set in force
        # again with it (so a restarted service gets it too): refused all the same.
        first_refusal(estate, ask, 401)
        assert estate.last_authz_reason() == "invalid_key"
        wait_until(lambda: revocations_kept(estate) > kept_before, 10, "the Link to keep the revocation")
        assert estate.admin.status()["last_report"]["generation"] == generation  # still FAILED there
    finally:
        weak = [i for i in estate.admin.issuers(TENANT) if i["issuer"] == "https://weak.consumers.example"]
        for issuer in weak:
            estate.admin.delete_issuer(TENANT, issuer["issuer_id"])
        estate.admin.wait_synced()
    assert ask().status_code == 401


def test_revocation_in_a_generation_the_link_refuses_still_applies(estate: Estate) -> None:
    created = new_key(estate)
    ask = lambda: get(estate, KEYED, [("x-api-key", created["key"])])  # noqa: E731
    assert ask().status_code == 200
    # The generation carrying the revocation also carries a module that does not compile: the Link
    # refuses it before anything is published.
    asyncio.run(store_policy_unchecked(estate.database_url, "package stoa\nallow if {"))
    estate.admin.revoke_key("acme", created["key_id"], tenant_id=TENANT)
    generation = estate.admin.desired_generation()
    try:
        assert "does not compile" in failed_on(estate, generation)["detail"]
        took = first_refusal(estate, ask, 401)
        print(f"revocation propagation past a refused generation: {took * 1000:.0f} ms")
        assert estate.last_authz_reason() == "invalid_key"
    finally:
        estate.admin.delete_policy("broken-opa", tenant_id=TENANT)
        estate.admin.wait_synced()
    assert ask().status_code == 401


@pytest.mark.parametrize(
    ("mode", "status"),
    [
        pytest.param("allow", 200, id="true"),
        pytest.param("who", 200, id="true-on-the-neutral-input"),
        pytest.param("deny", 403, id="false"),
        pytest.param("string", 403, id="not-a-boolean"),
        pytest.param("other", 403, id="undefined"),
    ],
)
def test_opa_policy_allows_only_on_true(estate: Estate, mode: str, status: int) -> None:
    key = new_key(estate)["key"]
    estate.upstream.clear()
    headers = [("x-api-key", key), ("x-trace", "t1"), ("x-stoa-consumer-id", "forged")]
    reply = get(estate, "/apis/ruled/x", headers, f"?mode={mode}")
    assert reply.status_code == status, reply.text
    if status == 403:
        assert reply.content == DENY_BODIES[403]
        assert estate.last_authz_reason() == "policy_denied"
        assert estate.upstream.arrivals() == []
    else:
        [arrival] = estate.upstream.arrivals()
        assert arrival.header("x-stoa-consumer-id") == "acme"


def test_opa_policy_sees_a_tokens_identity_and_consumer(estate: Estate, idp: DevIdentityProvider) -> None:
    """On a JWT route without subscriptions the policy still sees the consumer of the token's client."""
    estate.upstream.clear()
    acme = idp.mint(tenant=TENANT, azp="acme-app", sub="alice", scope="b:write a:read")
    reply = get(estate, "/apis/ruled-jwt/x", [("authorization", f"Bearer {acme}")], "?mode=token")
    assert reply.status_code == 200, reply.text
    [arrival] = estate.upstream.arrivals()
    assert arrival.header("x-stoa-subject") == "alice"
    idle = idp.mint(tenant=TENANT, azp="idle-app", sub="alice", scope="b:write a:read")
    refused = get(estate, "/apis/ruled-jwt/x", [("authorization", f"Bearer {idle}")], "?mode=token")
    assert refused.status_code == 403
    assert estate.last_authz_reason() == "policy_denied"
    assert len(estate.upstream.arrivals()) == 1


async def store_policy_unchecked(database_url: str, module: str) -> None:
    """An OPA policy written past the CP's rules, as one stored before them would be."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO policies (policy_id, type, config, scope, targets, tenant_id)"
            " VALUES ('broken-opa', 'opa', $1::jsonb, 'api', '{basket}', $2)",
            json.dumps({"module": module}),
            TENANT,
        )
    finally:
        await conn.close()


def test_opa_module_that_does_not_compile_is_refused_at_the_cp_and_at_the_site(estate: Estate) -> None:
    broken = "package stoa\nallow if {"
    with pytest.raises(CPError) as refused:
        estate.admin.create_policy(
            "broken-opa", "opa", {"module": broken}, tenant_id=TENANT, targets=["basket"]
        )
    assert (refused.value.status_code, refused.value.fields) == (422, ["config.module"])
    asyncio.run(store_policy_unchecked(estate.database_url, broken))
    estate.admin.create_consumer("nudge", tenant_id=TENANT)  # a new generation carries it to the site
    try:
        status = estate.admin.wait_failed()
        assert "does not compile" in status["last_report"]["detail"]
    finally:
        estate.admin.delete_policy("broken-opa", tenant_id=TENANT)
        estate.admin.delete_consumer("nudge", tenant_id=TENANT)
        estate.admin.wait_synced()
