"""Policy-set rollout through the real Link, the real Envoy and the real `stoa-authz`:
a key set the service would refuse is refused at the CP, and one stored before that rule is NACKed
and leaves everything as it was, a route built with set N is decided with N while N+1 rolls
out, a service without an audience denies everything and says so, and production refuses bad scopes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from google.protobuf import json_format
from google.rpc import code_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from stoa_harness.cp_client import CPError
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.site import console_script
from stoa_harness.wait import wait_until
from stoa_proto import authz_pb2
from stoa_translate.policy_set import route_version
from stoa_translate.snapshot import AUTHZ_POLICY_SET

AUDIENCE = "stoa-rollout"
IDP_ALG = "ES256"
PATH = "/apis/orders/items"
DIRECT_REQUEST_ID = "rollout-1"


@pytest.fixture(scope="module")
def estate(idp: DevIdentityProvider, estates: Callable[..., Estate]) -> Estate:
    options = EstateOptions(
        authz="service",
        authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE},
        # The rollout test holds Envoy still mid-publication; leave it room before the ACK deadline.
        # Every route through the service: this module is about the service's policy-set rollout.
        link_env={"STOA_LINK_ACK_TIMEOUT_S": "30", "STOA_LINK_DECISION_PLACEMENT": "service"},
    )
    running = estates(options, "estate-rollout")
    running.admin.create_tenant("demo", exist_ok=True)
    running.admin.add_issuer("demo", idp.issuer, jwks=idp.jwks())
    running.admin.wait_synced(
        running.publish("orders", tenant_id="demo", auth={"mode": "jwt", "scopes": ["orders:read"]})
    )
    assert running.site is not None
    running.site.wait_authz_ready()
    return running


def get(estate: Estate, token: str) -> httpx.Response:
    return estate.gateway.get(estate.url(PATH), headers={"authorization": f"Bearer {token}"})


def route_policy_version(estate: Estate, token: str) -> str:
    """The version of the policy set a request on Envoy's route `orders` is decided with right now
    (read from the decision event of a request)."""
    assert estate.site is not None
    before = len(estate.site.authz_decisions(direct=is_direct))
    estate.gateway.get(estate.url(PATH), headers={"authorization": f"Bearer {token}"})
    [event] = estate.site.authz_decisions(direct=is_direct)[before:]
    return event["policy_set_version"]


def is_direct(event: dict[str, Any]) -> bool:
    """A decision on a Check `direct_check` sent, not Envoy."""
    return event.get("request_id") == DIRECT_REQUEST_ID


def authz_events(estate: Estate, name: str) -> list[dict[str, Any]]:
    assert estate.site is not None
    return estate.site.authz_events(name)


def desired_route_version(estate: Estate) -> str:
    """The version of route `orders`' entry in the gateway's desired policy set (from the CP's preview
    of the Link's translation): what Envoy's route built with that set names in each Check (Envoy
    redacts context extensions in its config dump)."""
    resources = estate.admin.preview()["policy_sets"][AUTHZ_POLICY_SET]  # `default` and the route buckets
    (entry,) = [r for s in resources for r in s.get("routes", []) if r["route_id"] == "orders"]
    return route_version(json_format.ParseDict(entry, authz_pb2.AuthzRoute()))


def direct_check(estate: Estate, token: str, version: str) -> external_auth_pb2.CheckResponse:
    """The Check Envoy sends for a request on route `orders` built with the entry `version`."""
    request = external_auth_pb2.CheckRequest()
    request.attributes.context_extensions.update(
        {"tenant_id": "demo", "api_id": "orders", "route_id": "orders", "route_version": version}
    )
    http = request.attributes.request.http
    http.id, http.method, http.path = DIRECT_REQUEST_ID, "GET", PATH
    http.headers.update(
        {":authority": "gw", ":method": "GET", ":path": PATH, "authorization": f"Bearer {token}"}
    )
    assert estate.site is not None
    with grpc.insecure_channel(estate.site.ext_authz_address) as channel:
        return external_auth_pb2_grpc.AuthorizationStub(channel).Check(request, timeout=5)


def weak_rsa_jwks() -> dict[str, Any]:
    """A well-formed RSA public key the CP and the service refuse (1024 bits < 2048)."""
    numbers = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key().public_numbers()

    def b64(value: int) -> str:
        return (
            base64.urlsafe_b64encode(value.to_bytes((value.bit_length() + 7) // 8, "big"))
            .rstrip(b"=")
            .decode()
        )

    return {"keys": [{"kty": "RSA", "kid": "weak-1", "use": "sig", "n": b64(numbers.n), "e": b64(numbers.e)}]}


ADDED_ISSUERS = ("https://weak.example", "https://fine.example")


async def store_issuer_unchecked(
    database_url: str, tenant_id: str, issuer: str, keys: dict[str, Any]
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO issuers (issuer_id, tenant_id, issuer, jwks) VALUES ($1, $2, $3, $4::jsonb)",
            "iss-unchecked",
            tenant_id,
            issuer,
            json.dumps(keys),
        )
    finally:
        await conn.close()


def test_unusable_jwks_is_nacked_and_previous_decisions_stand(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    token = idp.mint(tenant="demo", scope="orders:read")
    assert get(estate, token).status_code == 200
    envoy_before = estate.envoy.versions()
    version_before = route_policy_version(estate, token)
    nacks_before = len(authz_events(estate, "policy_set_refused"))

    # The CP refuses the key by the service's own rule: nothing is stored, nothing changes.
    with pytest.raises(CPError) as refused:
        estate.admin.add_issuer("demo", "https://weak.example", jwks=weak_rsa_jwks())
    assert (refused.value.status_code, refused.value.fields) == (422, ["jwks.keys[0]"])
    assert estate.admin.status()["state"] == "SYNCED"
    # A key stored before that rule (written here straight into the CP's database) still fails safe at
    # the site: the next generation that reaches the tenant carries it, and the service NACKs it.
    asyncio.run(store_issuer_unchecked(estate.database_url, "demo", "https://weak.example", weak_rsa_jwks()))
    estate.admin.add_issuer("demo", "https://fine.example", jwks=idp.jwks())
    generation = estate.admin.desired_generation()
    try:
        status = wait_until(
            lambda: (
                (s := estate.admin.status())["state"] == "FAILED"
                and s["last_report"]["generation"] == generation
                and s
            ),
            30,
            "the gateway FAILED on the NACKed policy set",
        )
        report = status["last_report"]
        assert report["reason"] == "NACK"
        assert "RSA key shorter than 2048 bits" in report["detail"]  # the service's own words
        assert int(status["acknowledged_generation"]) < generation
        [refused] = authz_events(estate, "policy_set_refused")[nacks_before:]
        assert "2048" in refused["error"]
        # Previous decisions unchanged: same Envoy configuration, same policy set, same answers.
        assert estate.envoy.versions() == envoy_before
        assert route_policy_version(estate, token) == version_before
        assert get(estate, token).status_code == 200
        assert get(estate, idp.mint(tenant="demo", scope="orders:write")).status_code == 403
    finally:
        for added in [i for i in estate.admin.issuers("demo") if i["issuer"] in ADDED_ISSUERS]:
            estate.admin.delete_issuer("demo", added["issuer_id"])
        estate.admin.wait_synced()
    assert get(estate, token).status_code == 200


def test_route_built_with_set_n_is_decided_with_n_while_n_plus_1_rolls_out(
    estate: Estate, idp: DevIdentityProvider
) -> None:
    """Envoy is held still (SIGSTOP) after the service took set N+1, so the publication is caught
    between the two: the gateway is PENDING, Envoy's routes still name set N, and the Check such a
    route sends (replayed over gRPC to the real service) is decided with N's scopes."""
    reader = idp.mint(tenant="demo", scope="orders:read")
    writer = idp.mint(tenant="demo", scope="orders:write")
    assert get(estate, reader).status_code == 200
    set_n = route_policy_version(estate, reader)
    route_n = desired_route_version(estate)
    accepted_before = len(authz_events(estate, "policy_set_accepted"))
    envoy = estate.envoy.proc
    assert envoy is not None
    os.kill(envoy.pid, signal.SIGSTOP)
    try:
        body = {
            "name": "orders",
            "upstream_url": estate.upstream.url,
            "methods": ["GET"],
            "auth": {"mode": "jwt", "scopes": ["orders:write"]},
        }
        estate.admin.update_api("orders", body, tenant_id="demo")
        accepted = wait_until(
            lambda: authz_events(estate, "policy_set_accepted")[accepted_before:],
            15,
            "stoa-authz to accept set N+1",
        )
        set_n1 = accepted[-1]["policy_set_version"]
        assert set_n1 != set_n
        route_n1 = desired_route_version(estate)
        assert route_n1 != route_n
        assert estate.admin.status()["state"] == "PENDING"  # Envoy has not acknowledged its part
        # A request on a route built with N: N's scope requirement holds, not N+1's.
        assert direct_check(estate, reader, route_n).status.code == code_pb2.OK
        assert direct_check(estate, writer, route_n).denied_response.status.code == 403
        # The same request on a route built with N+1 follows N+1.
        assert direct_check(estate, reader, route_n1).denied_response.status.code == 403
        assert direct_check(estate, writer, route_n1).status.code == code_pb2.OK
    finally:
        os.kill(envoy.pid, signal.SIGCONT)
    estate.admin.wait_synced()
    assert route_policy_version(estate, reader) == set_n1
    assert get(estate, writer).status_code == 200
    assert get(estate, reader).status_code == 403
    # Set N is still kept for routes built with it.
    assert direct_check(estate, reader, route_n).status.code == code_pb2.OK


@pytest.fixture(scope="module")
def unconfigured(estates: Callable[..., Estate]) -> Estate:
    """stoa-authz without STOA_AUTHZ_AUDIENCE (development: it starts, warns and denies)."""
    options = EstateOptions(authz="service", authz_env={"STOA_AUTHZ_AUDIENCE": ""})
    # Without the audience no route is decided by Envoy either: the service denies everything.
    running = estates(options, "estate-no-aud")
    running.admin.wait_synced(running.publish("open", tenant_id="demo", auth={"mode": "none", "scopes": []}))
    running.admin.wait_synced(
        running.publish("orders", tenant_id="demo", auth={"mode": "jwt", "scopes": ["orders:read"]})
    )
    return running


def test_without_audience_every_request_is_denied_and_not_ready(
    unconfigured: Estate, idp: DevIdentityProvider
) -> None:
    token = idp.mint(tenant="demo", scope="orders:read", audience="")
    for path, headers in (("/apis/open/x", {}), (PATH, {"authorization": f"Bearer {token}"})):
        reply = unconfigured.gateway.get(unconfigured.url(path), headers=headers)
        assert reply.status_code == 503, (path, reply.text)
    assert unconfigured.site is not None
    ready = httpx.get(f"{unconfigured.site.authz_http_url}/health/ready")
    assert ready.status_code == 503
    assert ready.json()["status"] == "not_ready"
    assert ready.json()["reason"] == "not_configured"
    with grpc.insecure_channel(unconfigured.site.ext_authz_address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
    reasons = [e["reason"] for e in unconfigured.site.authz_decisions()]
    assert reasons[-2:] == ["not_configured", "not_configured"]


@pytest.mark.parametrize(
    ("scopes", "message"),
    [("", "STOA_AUTHZ_REQUIRED_SCOPES is empty"), ("orders:read, ,admin", "blank entry")],
)
def test_production_with_bad_scope_list_does_not_start(tmp_path: Path, scopes: str, message: str) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "STOA_ENV": "production",
        "STOA_AUTHZ_AUDIENCE": AUDIENCE,
        "STOA_AUTHZ_REQUIRED_SCOPES": scopes,
        # Everything else production needs is present, so the scope list is what refuses start-up.
        "STOA_AUTHZ_TLS_CA": str(tmp_path / "ca.pem"),
        "STOA_AUTHZ_TLS_CERT": str(tmp_path / "cert.pem"),
        "STOA_AUTHZ_TLS_KEY": str(tmp_path / "key.pem"),
        "STOA_AUTHZ_SIGNING_KEY_FILE": str(tmp_path / "signing.pem"),
    }
    done = subprocess.run(
        [console_script("stoa-authz")], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "refusing to start in production" in done.stderr
    assert message in done.stderr
