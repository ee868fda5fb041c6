"""The listener's filter chain (cors, rbac, ext_authz, local_ratelimit, router) and its
hardening, through a real Envoy, proven by what the Check witness and the echo upstream recorded.

Path-confusion requests go out as written (`stoa_harness.raw_http`: httpx would normalise the path first).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
import pytest
from stoa_harness import raw_http
from stoa_harness.estate import Estate
from stoa_harness.raw_http import Reply
from stoa_harness.wait import wait_until
from stoa_harness.witness import Check
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES

TENANT = "chain"
ORIGIN = "https://app.example.com"
FOREIGN_ORIGIN = "https://evil.example.net"
CORS_CONFIG = {
    "allowedOrigins": [ORIGIN],
    "allowedMethods": ["GET", "POST"],
    "allowedHeaders": ["content-type"],
    "exposeHeaders": ["x-trace-id"],
    "maxAge": 60,
    "allowCredentials": True,
}
PREFLIGHT = (("origin", ORIGIN), ("access-control-request-method", "POST"))
# Envoy's answer to a request the authorization service could not decide: bounded by design.
RETRY_AFTER_BOUND_S = 60


def send(
    estate: Estate,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
) -> Reply:
    return raw_http.send(estate.gateway_url, method, target, headers, body)


@pytest.fixture(scope="module")
def chain(estate: Estate) -> Estate:
    up = estate.upstream
    estate.publish("chain", tenant_id=TENANT, upstream_url=f"{up.url}/chain-up", methods=["GET", "POST"])
    estate.publish("pc", tenant_id=TENANT, upstream_url=f"{up.url}/pc-up", methods=["GET"])
    estate.publish("chain-ip", tenant_id=TENANT, upstream_url=f"{up.url}/ip-up", methods=["GET"])
    for policy_id, policy_type, config, api_id in (
        ("chain-cors", "cors", CORS_CONFIG, "chain"),
        ("chain-ip-deny", "ip_filter", {"mode": "deny", "ip_list": ["127.0.0.1"]}, "chain-ip"),
    ):
        estate.admin.add_policy(policy_id, policy_type, config, tenant_id=TENANT, targets=[api_id])
    estate.admin.wait_synced()
    return estate


pytestmark = pytest.mark.usefixtures("fresh_records")


def untouched(estate: Estate) -> bool:
    return estate.witness.checks() == [] and estate.upstream.arrivals() == []


# -- Check precedes routing ---------------------------------------------------------------------
def test_every_routed_request_was_checked_before_the_upstream_saw_it(chain: Estate) -> None:
    requests = [
        ("GET", "/apis/chain/a", None),
        ("POST", "/apis/chain/orders", b'{"n":1}'),
        ("GET", "/apis/chain/a/b?q=1", None),
        ("GET", "/apis/chain", None),
        ("POST", "/apis/chain/x", b""),
    ]
    for probe, (method, target, body) in enumerate(requests):
        assert send(chain, method, target, [("x-probe", str(probe))], body).status == 200

    checks = {c.header("x-probe"): c for c in chain.witness.checks()}
    arrivals = {a.header("x-probe"): a for a in chain.upstream.arrivals()}
    assert sorted(checks) == sorted(arrivals) == [str(i) for i in range(len(requests))]
    for probe, check in checks.items():
        assert check.at < arrivals[probe].at, f"request {probe} reached the upstream before its Check"
        assert check.context_extensions["tenant_id"] == TENANT
        assert check.context_extensions["api_id"] == check.context_extensions["route_id"] == "chain"
        assert check.context_extensions["route_version"]


def test_a_denied_request_never_reaches_the_upstream(chain: Estate) -> None:
    chain.witness.deny()
    get = send(chain, "GET", "/apis/chain/a")
    post = send(chain, "POST", "/apis/chain/a", body=b'{"pay":1}')

    for reply in (get, post):
        assert reply.status == 403
        assert reply.body == DENY_BODIES[403]
        assert reply.headers["content-type"] == CONTENT_TYPE
    assert [c.method for c in chain.witness.checks()] == ["GET", "POST"]
    assert chain.upstream.arrivals() == []


# -- CORS cannot bypass a denial ----------------------------------------------------------------
def test_a_genuine_preflight_is_answered_by_envoy_even_while_the_witness_denies(chain: Estate) -> None:
    chain.witness.deny()
    reply = send(chain, "OPTIONS", "/apis/chain/orders", PREFLIGHT)

    assert reply.status == 200
    assert reply.cors()["access-control-allow-origin"] == ORIGIN
    assert untouched(chain)


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        pytest.param((), None, id="bare-options"),
        pytest.param(
            (("origin", FOREIGN_ORIGIN), ("access-control-request-method", "POST")), None, id="foreign-origin"
        ),
        pytest.param((("origin", ORIGIN), ("content-type", "application/json")), b'{"x":1}', id="with-body"),
        pytest.param((), b'{"x":1}', id="bare-with-body"),
    ],
)
def test_an_options_that_is_not_a_genuine_preflight_is_denied(
    chain: Estate, headers: tuple[tuple[str, str], ...], body: bytes | None
) -> None:
    chain.witness.deny()
    reply = send(chain, "OPTIONS", "/apis/chain/orders", headers, body)

    assert reply.status == 403
    assert reply.body == DENY_BODIES[403]
    [check] = chain.witness.checks()
    assert check.method == "OPTIONS"
    assert chain.upstream.arrivals() == []
    if dict(headers).get("origin") != ORIGIN:
        assert reply.cors() == {}


def test_a_preflight_shaped_options_with_a_body_never_reaches_the_upstream(chain: Estate) -> None:
    # The witness allows: were the request passed on, the upstream would record it.
    reply = send(chain, "OPTIONS", "/apis/chain/orders", PREFLIGHT, b'{"smuggled":true}')

    assert reply.status == 200  # answered by Envoy's cors filter as the preflight it looks like
    assert reply.cors()["access-control-allow-origin"] == ORIGIN
    assert reply.cors()["access-control-allow-methods"] == "GET,POST"
    assert reply.body == b""
    assert chain.witness.checks() == []
    assert chain.upstream.arrivals() == []


@pytest.mark.parametrize("status", [401, 403])
def test_a_denial_to_an_allowed_origin_carries_the_cors_headers(chain: Estate, status: int) -> None:
    chain.witness.deny(status)
    allowed = send(chain, "GET", "/apis/chain/a", [("origin", ORIGIN)])
    foreign = send(chain, "GET", "/apis/chain/a", [("origin", FOREIGN_ORIGIN)])

    assert allowed.status == foreign.status == status
    assert allowed.body == DENY_BODIES[status]
    cors = allowed.cors()
    assert cors["access-control-allow-origin"] == ORIGIN
    assert cors["access-control-allow-credentials"] == "true"
    assert cors["access-control-expose-headers"] == "x-trace-id"
    assert foreign.cors() == {}
    assert chain.upstream.arrivals() == []


# -- address filter before authorization ----------------------------------------------------------
def test_an_address_denied_request_never_reaches_the_witness(chain: Estate) -> None:
    replies = [
        send(chain, "GET", "/apis/chain-ip/x"),
        send(chain, "GET", "/apis/chain-ip/x", [("x-forwarded-for", "203.0.113.5")]),
    ]

    assert [r.status for r in replies] == [403, 403]
    assert untouched(chain)


# -- path confusion and header hardening --------------------------------------------------------
REFUSED = "refused"
# `;` is an ordinary path character to Envoy; what matters is that Check and upstream agree.
CONSISTENT = "consistent"


@pytest.mark.parametrize(
    ("target", "suffix"),
    [
        ("/apis/pc//x", "/x"),
        ("/apis//pc/x", "/x"),
        ("//apis/pc/x", "/x"),
        ("/apis/pc/a/../x", "/x"),
        ("/apis/pc/./x", "/x"),
        ("/apis/pc/a/%2e%2e/x", "/x"),
        ("/apis/pc/a/%2E%2E/x", "/x"),
        ("/apis/other/../pc/x", "/x"),
        ("/apis/pc/a%2Fx", REFUSED),
        ("/apis/pc/a%2fx", REFUSED),
        ("/apis/pc/a%5Cx", REFUSED),
        ("/apis/pc/%2e%2e/%2e%2e/admin", REFUSED),
        ("/apis/pc/../secret/x", REFUSED),
        ("/apis/pc;/x", REFUSED),
        ("/apis/pc/x;y=1", CONSISTENT),
        ("/apis/pc/a;v=1/b", "/a;v=1/b"),
        ("/apis/pc/..;/x", CONSISTENT),
        ("/apis/pc/a/..;/x", CONSISTENT),
        ("/apis/pc/x;/../y", CONSISTENT),
        # Dot segments Envoy does not resolve, which a server that decodes (once or twice) and drops
        # ;parameters would: refused before any route or Check.
        ("/apis/pc/%2e%2e;/admin", REFUSED),
        ("/apis/pc/%2E%2e;v=1/admin", REFUSED),
        ("/apis/pc/.%2e;/admin", REFUSED),
        ("/apis/pc/%2e;/x", REFUSED),
        ("/apis/pc/..%3b/admin", REFUSED),
        ("/apis/pc/%252e%252e;/admin", REFUSED),
        ("/apis/pc/%252E%252E/admin", REFUSED),
        ("/apis/pc/%%32%65%%32%65/admin", REFUSED),
        ("/apis/pc/%2%65%2%45/admin", REFUSED),
        ("/apis/pc/a%252f..%252fadmin", REFUSED),
        ("/apis/pc/%255c..%255cadmin", REFUSED),
        ("/apis/pc/..%253B/admin", REFUSED),
    ],
)
def test_path_confusion_reaches_witness_and_upstream_as_one_normalised_path_or_is_refused(
    chain: Estate, target: str, suffix: str
) -> None:
    reply = send(chain, "GET", target)

    if suffix == REFUSED or (suffix == CONSISTENT and reply.status != 200):
        assert 400 <= reply.status < 500, reply.status
        assert untouched(chain)
        if reply.status == 400:
            assert reply.body == DENY_BODIES[400]
            assert reply.headers["content-type"] == CONTENT_TYPE
        return
    assert reply.status == 200
    [check] = chain.witness.checks()
    [arrival] = chain.upstream.arrivals()
    assert check.path.startswith("/apis/pc/")
    seen = check.path.removeprefix("/apis/pc")
    assert arrival.path == f"/pc-up{seen}"  # the upstream got exactly what was authorized
    if suffix == CONSISTENT:
        assert not any(seg in (".", "..", "") for seg in seen.split("/")[1:]), seen
    else:
        assert seen == suffix


@pytest.mark.parametrize("name", ["x_tenant_id", "X_Stoa_Tenant_Id", "x-tenant_id"])
def test_a_header_name_with_an_underscore_is_refused(chain: Estate, name: str) -> None:
    reply = send(chain, "GET", "/apis/chain/a", [(name, "other-tenant")])

    assert reply.status == 400
    assert untouched(chain)


def test_a_client_x_envoy_original_path_does_not_reach_the_upstream(chain: Estate) -> None:
    reply = send(chain, "GET", "/apis/chain/a", [("x-envoy-original-path", "/admin/secret")])

    assert reply.status == 200
    [arrival] = chain.upstream.arrivals()
    assert arrival.path == "/chain-up/a"
    assert arrival.header("x-envoy-original-path") is None


def test_a_client_is_never_marked_internal(chain: Estate) -> None:
    plain = send(chain, "GET", "/apis/chain/a")
    claimed = send(chain, "GET", "/apis/chain/b", [("x-envoy-internal", "true")])

    assert plain.status == claimed.status == 200
    for arrival in chain.upstream.arrivals():
        assert arrival.header("x-envoy-internal") is None, arrival.path


def test_client_retry_headers_are_not_honoured(chain: Estate) -> None:
    chain.upstream.reply_with(status=503)
    reply = send(
        chain,
        "POST",
        "/apis/chain/pay",
        [("x-envoy-retry-on", "5xx"), ("x-envoy-max-retries", "3")],
        b'{"pay":1}',
    )

    assert reply.status == 503
    assert len(chain.upstream.arrivals()) == 1  # a non-idempotent request went upstream once


# -- the authorization service failing ----------------------------------------------------------
def assert_unavailable(reply: Reply, denied: Reply) -> None:
    assert reply.status == 503
    assert reply.body == denied.body == DENY_BODIES[403]  # byte-identical to the 403's
    assert reply.headers["content-type"] == denied.headers["content-type"]
    retry_after = reply.headers.get("retry-after", "")
    assert retry_after.isdigit(), retry_after
    assert 1 <= int(retry_after) <= RETRY_AFTER_BOUND_S


def wait_serving(estate: Estate) -> None:
    wait_until(lambda: send(estate, "GET", "/apis/chain/ready").status == 200, 15, "authorization back")


def test_witness_stopped_gives_503_with_the_neutral_body_and_upstream_untouched(chain: Estate) -> None:
    chain.witness.deny()
    denied = send(chain, "GET", "/apis/chain/a")
    assert denied.status == 403
    chain.witness.crash()
    try:
        get = send(chain, "GET", "/apis/chain/a")
        post = send(chain, "POST", "/apis/chain/a", body=b'{"pay":1}')
    finally:
        chain.witness.start()

    assert_unavailable(get, denied)
    assert_unavailable(post, denied)
    assert chain.upstream.arrivals() == []
    chain.witness.allow()
    wait_serving(chain)


def test_witness_hanging_past_the_timeout_gives_503_without_retry(chain: Estate) -> None:
    chain.witness.deny()
    denied = send(chain, "GET", "/apis/chain/a")
    chain.witness.clear()
    chain.witness.hang()
    started = time.monotonic()
    get = send(chain, "GET", "/apis/chain/a", [("x-probe", "held-get")])
    post = send(chain, "POST", "/apis/chain/a", [("x-probe", "held-post")], b'{"pay":1}')
    elapsed = time.monotonic() - started
    held: list[Check] = chain.witness.checks()
    chain.witness.release()

    assert_unavailable(get, denied)
    assert_unavailable(post, denied)
    assert elapsed < 5.0  # the bounded ext_authz timeout, not the client's
    # One Check per request: nothing was retried, the POST in particular.
    assert sorted(c.header("x-probe") or "" for c in held) == ["held-get", "held-post"]
    wait_serving(chain)
    assert [a.path for a in chain.upstream.arrivals()] == ["/chain-up/ready"]


def test_witness_answering_grpc_internal_gives_503_with_the_neutral_body_and_upstream_untouched(
    chain: Estate,
) -> None:
    chain.witness.deny()
    denied = send(chain, "GET", "/apis/chain/a")
    chain.witness.clear()
    chain.witness.fail(grpc.StatusCode.INTERNAL)
    get = send(chain, "GET", "/apis/chain/a")
    post = send(chain, "POST", "/apis/chain/a", body=b'{"pay":1}')

    assert_unavailable(get, denied)
    assert_unavailable(post, denied)
    assert len(chain.witness.checks()) == 2  # it was asked, and said INTERNAL: no retry
    assert chain.upstream.arrivals() == []


def test_witness_allowing_after_the_timeout_gives_503_and_the_late_allow_is_ignored(chain: Estate) -> None:
    chain.witness.deny()
    denied = send(chain, "GET", "/apis/chain/a")
    chain.witness.clear()
    late_s = 1.0  # four times the Link's default ext_authz timeout (250 ms)
    chain.witness.slow(late_s)  # then allow
    started = time.monotonic()
    get = send(chain, "GET", "/apis/chain/a")
    post = send(chain, "POST", "/apis/chain/a", body=b'{"pay":1}')
    answered_in = time.monotonic() - started

    assert_unavailable(get, denied)
    assert_unavailable(post, denied)
    assert answered_in < 2 * late_s  # Envoy gave up on each Check, it did not wait for the allow
    checks = chain.witness.checks()
    assert len(checks) == 2
    # Past the moment the last late allow was sent, still nothing reached the upstream.
    wait_until(lambda: time.monotonic() > checks[-1].at + late_s + 0.2, 5, "late allows sent")
    assert chain.upstream.arrivals() == []
    chain.witness.allow()
    wait_serving(chain)
