"""One contract whatever the placement: the authorization decision table through two real sites on
one CP, the same APIs deployed on both — `gw-1` decides where Envoy can (`auto`), `gw-service` sends
every route through the authorization service (`STOA_LINK_DECISION_PLACEMENT=service`). Every case
must get the same status, headers and body from both, the upstream must see the same identity, and
the denials must be logged with the same closed reasons (by the Link for Envoy's own denials)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.site import Site
from stoa_harness.wait import wait_until

AUDIENCE = "stoa-differential"
SERVICE_GATEWAY = "gw-service"
ORDERS = "/apis/orders/items"
OPEN = "/apis/open/x"
SEALED = "/apis/sealed/x"
FORGED = [
    ("X-Stoa-Tenant-Id", "evil"),
    ("X-USER-ID", "root"),
    ("x-Tenant-Id", "evil"),
    ("x-stoa-subject", "x"),
]
# Per request or per connection (hop-by-hop), not part of the contract.
VARYING_HEADERS = {"date", "server", "x-request-id", "content-length", "connection"}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed(
    idp: DevIdentityProvider,
    header: dict[str, Any],
    drop: str = "",
    tenant: str = "demo",
    repeated: tuple[str, str] | None = None,
    repeated_header: tuple[str, str] | None = None,
) -> str:
    """A token signed by the trusted key (RS256) with an extra protected header, a claim left out or
    a member repeated (`repeated`, `repeated_header`: a second member of that name, last in the
    payload or the header), signed without the JOSE library, which refuses to produce some of these."""
    claims = {k: v for k, v in idp.claims(tenant=tenant, scope="orders:read").items() if k != drop}
    payload = json.dumps(claims)
    if repeated is not None:
        payload = f"{payload[:-1]}, {json.dumps(repeated[0])}: {json.dumps(repeated[1])}}}"
    head = json.dumps({"alg": "RS256", "kid": idp.kid, "typ": "JWT", **header})
    if repeated_header is not None:
        head = f"{head[:-1]}, {json.dumps(repeated_header[0])}: {json.dumps(repeated_header[1])}}}"
    signing_input = f"{_b64(head.encode())}.{_b64(payload.encode())}"
    signature = idp._key.private_key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64(signature)}"


Headers = list[tuple[str, str]]


def bearer(token: str, scheme: str = "Bearer") -> Headers:
    return [("authorization", f"{scheme} {token}")]


def cases(idp: DevIdentityProvider) -> dict[str, tuple[str, Headers]]:
    """The decision table: case → (path, request headers). Tokens are minted once per run."""
    good = {"tenant": "demo", "scope": "orders:read"}
    token = idp.mint(**good)
    return {
        "no token": (ORDERS, []),
        "basic scheme": (ORDERS, [("authorization", "Basic dTpw")]),
        "good": (ORDERS, bearer(token)),
        "good, lower-case scheme": (ORDERS, bearer(token, "bearer")),
        "good, mixed-case scheme": (ORDERS, bearer(token, "BeArEr")),
        "token in the query only": (f"{ORDERS}?access_token={token}", []),
        "forged identity headers": (ORDERS, bearer(token) + FORGED),
        "duplicate authorization": (ORDERS, bearer(token) + bearer(token)),
        "garbage": (ORDERS, bearer("not-a-jwt")),
        "bad signature": (ORDERS, bearer(idp.bad_signature(**good))),
        "alg none": (ORDERS, bearer(idp.alg_none(**good))),
        "hs256 with the public key": (ORDERS, bearer(idp.hs256_with_public_key(**good))),
        "expired": (ORDERS, bearer(idp.expired(**good))),
        "not yet valid": (ORDERS, bearer(idp.not_yet_valid(**good))),
        "other issuer": (ORDERS, bearer(idp.other_issuer(**good))),
        "wrong audience": (ORDERS, bearer(idp.wrong_audience(**good))),
        "audience list": (ORDERS, bearer(idp.mint(audience=["x", AUDIENCE], **good))),
        "unknown kid": (ORDERS, bearer(idp.sign(idp.claims(**good), {"kid": "nope"}))),
        "no exp": (ORDERS, bearer(idp.mint(exp=None, **good))),
        "no iss": (ORDERS, bearer(_signed(idp, {}, drop="iss"))),
        "no sub": (ORDERS, bearer(_signed(idp, {}, drop="sub"))),
        # Token hygiene (issue 10): `sub` is copied into x-stoa-subject, so it must reach the upstream
        # as the token says it (stoa_proto.decisions.HEADER_CLAIM).
        "sub with CR LF": (ORDERS, bearer(idp.mint(sub="c\r\nx-stoa-tenant-id: other", **good))),
        "sub with NUL": (ORDERS, bearer(idp.mint(sub="c\x00x", **good))),
        "sub with a tab": (ORDERS, bearer(idp.mint(sub="c\tx", **good))),
        "sub with DEL": (ORDERS, bearer(idp.mint(sub="c\x7fx", **good))),
        "sub with a leading space": (ORDERS, bearer(idp.mint(sub=" admin", **good))),
        "sub with a trailing space": (ORDERS, bearer(idp.mint(sub="admin ", **good))),
        "sub with an inner space": (ORDERS, bearer(idp.mint(sub="service account 7", **good))),
        "sub not ASCII": (ORDERS, bearer(idp.mint(sub="client-\u00e9", **good))),
        "sub with a no-break space": (ORDERS, bearer(idp.mint(sub="admin\u00a0", **good))),
        "sub with a line separator": (ORDERS, bearer(idp.mint(sub="c\u2028x", **good))),
        "sub with a right-to-left override": (ORDERS, bearer(idp.mint(sub="c\u202ex", **good))),
        "sub empty": (ORDERS, bearer(idp.mint(sub="", **good))),
        "sub a number": (ORDERS, bearer(idp.mint(sub=4711, **good))),
        "lifetime above the maximum": (ORDERS, bearer(idp.mint(lifetime_s=86_400 + 300, **good))),
        "no iat, expiring beyond the maximum": (
            ORDERS,
            bearer(idp.mint(iat=None, lifetime_s=86_400 + 300, **good)),
        ),
        "tenant claim with CR LF": (ORDERS, bearer(idp.mint(tenant="demo\r\nx", scope="orders:read"))),
        # Claims of another JSON type, or repeated (JSON parsers differ on which member wins).
        "tenant claim a list": (ORDERS, bearer(idp.mint(tenant=["demo"], scope="orders:read"))),
        "scope a list": (ORDERS, bearer(idp.sign({**idp.claims(tenant="demo"), "scope": ["orders:read"]}))),
        "tenant claim repeated, ours last": (
            ORDERS,
            bearer(_signed(idp, {}, tenant="other", repeated=("tenant_id", "demo"))),
        ),
        "tenant claim repeated, ours first": (
            ORDERS,
            bearer(_signed(idp, {}, repeated=("tenant_id", "other"))),
        ),
        "sub repeated": (ORDERS, bearer(_signed(idp, {}, repeated=("sub", "admin")))),
        "kid repeated": (ORDERS, bearer(_signed(idp, {"kid": "nope"}, repeated_header=("kid", idp.kid)))),
        "no aud": (ORDERS, bearer(_signed(idp, {}, drop="aud"))),
        "critical header extension": (ORDERS, bearer(_signed(idp, {"crit": ["b64"], "b64": True}))),
        "other tenant": (ORDERS, bearer(idp.mint(tenant="other", scope="orders:read"))),
        "no tenant claim": (ORDERS, bearer(idp.mint(tenant=None, scope="orders:read"))),
        "missing scope": (ORDERS, bearer(idp.mint(tenant="demo", scope="orders:write"))),
        "scope prefix only": (ORDERS, bearer(idp.mint(tenant="demo", scope="orders:readx"))),
        "other tenant and missing scope": (ORDERS, bearer(idp.mint(tenant="other", scope="x"))),
        "scope among others": (ORDERS, bearer(idp.mint(tenant="demo", scope="a orders:read b"))),
        "scp list": (ORDERS, bearer(idp.mint(tenant="demo", scope=None, scp=["orders:read"]))),
        "scp string": (ORDERS, bearer(idp.mint(tenant="demo", scope=None, scp="a orders:read"))),
        "no token needed": (OPEN, []),
        "no token needed, forged identity": (OPEN, FORGED),
        "envelope, good": (SEALED, bearer(token) + FORGED),
        "envelope, no token": (SEALED, []),
        "envelope, wrong audience": (SEALED, bearer(idp.wrong_audience(**good))),
        "envelope, missing scope": (SEALED, bearer(idp.mint(tenant="demo", scope="orders:write"))),
    }


@pytest.fixture(scope="module")
def sites(
    idp: DevIdentityProvider, estates: Callable[..., Estate], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Estate, Site]]:
    """The estate (gw-1, placement auto) and a second site on its CP (every route to the service)."""
    authz_env = {"STOA_AUTHZ_AUDIENCE": AUDIENCE}
    estate = estates(EstateOptions(authz="service", authz_env=authz_env), "estate-placement")
    created = estate.admin.create_gateway(SERVICE_GATEWAY, "service")
    with Site(
        run_dir=tmp_path_factory.mktemp("site-service"),
        cp_url=estate.cp_url,
        gateway_id=SERVICE_GATEWAY,
        credential=created["credential"],
        authz="service",
        link_env={"STOA_LINK_DECISION_PLACEMENT": "service"},
        authz_env=authz_env,
    ) as service:
        for tenant in ("demo", "other"):
            estate.admin.create_tenant(tenant, exist_ok=True)
        # Keys inline only: with a jwks_uri the service may also fetch keys on an unknown kid (within
        # the Check's timeout, or not), which Envoy never does; the README says so.
        estate.admin.add_issuer("demo", idp.issuer, jwks=idp.jwks())
        apis = {
            "orders": {"mode": "jwt", "scopes": ["orders:read"]},
            "open": {"mode": "none", "scopes": []},
            "sealed": {"mode": "jwt", "scopes": ["orders:read"], "envelope": True},
        }
        for api_id, auth in apis.items():
            estate.create_api(api_id, tenant_id="demo", auth=auth)
            estate.admin.deploy(api_id)
            estate.admin.deploy(api_id, SERVICE_GATEWAY)
        estate.admin.wait_synced()
        estate.admin.wait_synced(gateway_id=SERVICE_GATEWAY)
        for site in (estate.site, service):
            assert site is not None
            site.wait_authz_ready()
        yield estate, service


def _answer(reply: httpx.Response) -> dict[str, Any]:
    """What a client sees, and for an allowed request what the upstream saw of the identity."""
    headers = sorted((k, v) for k, v in reply.headers.multi_items() if k not in VARYING_HEADERS)
    if reply.status_code != 200:
        return {"status": reply.status_code, "headers": headers, "body": reply.content}
    echoed = reply.json()["headers"]
    upstream = {
        name: "<signed envelope>" if name == "x-stoa-identity" else value
        for name, value in echoed.items()
        if name.startswith(("x-stoa-", "x-user-", "x-tenant-")) or name == "authorization"
    }
    client = [(k, v) for k, v in headers if k not in ("content-type",)]
    return {"status": 200, "headers": client, "upstream": upstream}


def logged_native_denials(estate: Estate) -> int:
    """Once the Link logged as many decision events as Envoy made native denials: that number."""
    assert estate.site is not None
    site = estate.site

    def caught_up() -> tuple[int] | None:
        made = estate.envoy.counters(r"^http\.stoa\.(jwt_authn|rbac)\.denied$")
        return (made,) if len(site.link_events("ext_authz_decision")) == made else None

    [made] = wait_until(caught_up, 15, "the Link logged every native denial")
    return made


def test_every_case_answers_the_same_whatever_the_placement(
    sites: tuple[Estate, Site], idp: DevIdentityProvider
) -> None:
    estate, service = sites
    native_url, service_url = estate.gateway_url, service.gateway_url
    table = cases(idp)
    different = {}
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10.0) as client:
        for name, (path, headers) in table.items():
            native = _answer(client.get(native_url + path, headers=headers))
            through_service = _answer(client.get(service_url + path, headers=headers))
            if native != through_service:
                different[name] = {"envoy": native, "service": through_service}
    assert different == {}, json.dumps(different, indent=1, default=str)


def test_envoy_decides_natively_and_logs_the_same_reasons(
    sites: tuple[Estate, Site], idp: DevIdentityProvider
) -> None:
    """The native site's Checks happen only on the envelope route; its Link logs Envoy's denials
    with the reasons the service logs for the same requests."""
    estate, service = sites
    native_site = estate.site
    assert native_site is not None
    table = {name: case for name, case in cases(idp).items() if case[0] == ORDERS}
    checks = r"^http\..*\.ext_authz\.(ok|denied|error)$"
    checks_before = estate.envoy.counters(checks)
    # Envoy sends its access log in batches: first every native denial made so far is logged.
    link_before = logged_native_denials(estate)
    service_before = len(service.authz_decisions())
    denied = 0
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10.0) as client:
        for path, headers in table.values():
            denied += client.get(native_site.gateway_url + path, headers=headers).status_code != 200
            client.get(service.gateway_url + path, headers=headers)
    assert denied > 10

    link_after = logged_native_denials(estate)
    logged = native_site.link_events("ext_authz_decision")[link_before:link_after]
    assert len(logged) == denied
    service_events = service.authz_decisions()[service_before:]
    service_reasons = sorted(e["reason"] for e in service_events if e["decision"] == "deny")
    native_reasons = sorted(e["reason"] for e in logged)
    assert native_reasons == service_reasons, json.dumps([native_reasons, service_reasons])
    assert {(e["tenant"], e["api"], e["route"], e["decided_by"]) for e in logged} == {
        ("demo", "orders", "orders", "envoy")
    }
    # No Check for a route Envoy decides.
    assert estate.envoy.counters(checks) == checks_before
