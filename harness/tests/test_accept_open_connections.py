"""A connection Envoy accepted before a change meets the change's policies.

Envoy keeps serving a connection on the listener that accepted it until that listener has drained,
while the route tables it reads are already the new ones. So the first route of a kind that needs a
filter — Envoy-verified JWTs, address rules, a rate limit, a body policy — must not depend on a filter
that only a newer listener has: the chain is the same from the first publication on, each filter
switched on by the routes that need it. This gateway's Envoy keeps replaced listeners for an hour, so
the connection opened before the change is still served by the listener that accepted it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Callable, Iterator

import httpx
import pytest
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_proto.bodies import DENY_BODIES

AUDIENCE = "stoa-open-connections"
TENANT = "demo"
# Long enough that no response of the test is the drain's (Envoy closes a draining connection with a
# probability that grows over the drain time), and a replaced listener outlives the test.
DRAIN_TIME_S = 3600


@pytest.fixture(scope="module")
def gateway(estates: Callable[..., Estate]) -> Estate:
    return estates(
        EstateOptions(
            authz="service",
            authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE},
            proc=True,
            envoy_drain_time_s=DRAIN_TIME_S,
        ),
        "estate-open-connections",
    )


class Connection:
    """One keep-alive connection to the gateway; every request must go over the same socket."""

    def __init__(self, estate: Estate) -> None:
        host, port = estate.gateway_url.removeprefix("http://").rsplit(":", 1)
        self._conn = http.client.HTTPConnection(host, int(port), timeout=10)
        self._local: tuple[str, int] | None = None

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        self._conn.request(method, path, body=body, headers=headers or {})
        if self._local is None:
            self._local = self._conn.sock.getsockname()
        assert self._conn.sock.getsockname() == self._local, "the gateway's connection was opened again"
        response = self._conn.getresponse()
        content = response.read()
        assert response.getheader("connection") != "close", "Envoy closed the connection (draining)"
        return response.status, content

    def close(self) -> None:
        self._conn.close()


@pytest.fixture
def old_connection(gateway: Estate, idp: DevIdentityProvider) -> Iterator[Connection]:
    """A connection opened on the first publication's listener: one open route, no policy at all;
    the tenant trusts the identity provider (keys inline, so Envoy verifies its tokens), but no
    route asks for a token yet."""
    gateway.admin.create_tenant(TENANT, exist_ok=True)
    gateway.admin.add_issuer(TENANT, idp.issuer, jwks=idp.jwks())
    gateway.publish("first", tenant_id=TENANT, auth={"mode": "none", "scopes": []})
    gateway.admin.wait_synced()
    connection = Connection(gateway)
    try:
        status, _ = connection.request("GET", "/apis/first/x")
        assert status == 200
        yield connection
    finally:
        connection.close()


def test_the_first_policies_of_each_kind_apply_on_a_connection_opened_before_them(
    gateway: Estate, old_connection: Connection, idp: DevIdentityProvider
) -> None:
    admin, up = gateway.admin, gateway.upstream
    # Envoy verifies the token and decides the route itself (no Check).
    gateway.publish("orders", tenant_id=TENANT, auth={"mode": "jwt", "scopes": ["orders:read"]})
    open_auth = {"mode": "none", "scopes": []}
    for api_id in ("fenced", "metered", "guarded"):
        gateway.publish(
            api_id,
            tenant_id=TENANT,
            upstream_url=f"{up.url}/{api_id}",
            methods=["GET", "POST"],
            auth=open_auth,
        )
    admin.add_policy(
        "fence",
        "ip_filter",
        {"mode": "deny", "ip_list": ["127.0.0.0/8"]},
        tenant_id=TENANT,
        targets=["fenced"],
    )
    admin.add_policy(
        "meter",
        "rate_limit",
        {"maxRequests": 1, "intervalSeconds": 3600},
        tenant_id=TENANT,
        targets=["metered"],
    )
    guard = {"direction": "request", "blockPatterns": ["forbidden fruit"]}
    admin.add_policy("guard", "guardrails", guard, tenant_id=TENANT, targets=["guarded"])
    admin.wait_synced()

    old = old_connection
    status, _ = old.request("GET", "/apis/orders/items")
    assert status == 401, "a JWT route answered a request without a token"
    no_scope = idp.mint(tenant=TENANT, scope="other:read")
    status, _ = old.request("GET", "/apis/orders/items", headers={"authorization": f"Bearer {no_scope}"})
    assert status == 403, "a JWT route answered a token without its scope"
    good = idp.mint(tenant=TENANT, scope="orders:read")
    assert old.request("GET", "/apis/orders/items", headers={"authorization": f"Bearer {good}"})[0] == 200
    status, _ = old.request("GET", "/apis/fenced/x")
    assert status == 403, "an address rule let a denied address through"
    assert old.request("GET", "/apis/metered/x")[0] == 200
    assert old.request("GET", "/apis/metered/x")[0] == 429, "a rate limit did not count the request"
    body = json.dumps({"q": "the forbidden fruit"}).encode()
    status, content = old.request(
        "POST", "/apis/guarded/x", body=body, headers={"content-type": "application/json"}
    )
    assert status == 403, "a guardrail let a blocked pattern through"
    assert json.loads(content)["error"] == "guardrail_blocked"
    # The processor is on only where a body policy is: the open route beside it opens no stream.
    streams = gateway.envoy.counters(r"ext_proc\..*streams_started$")
    assert streams > 0  # the guarded request's
    assert old.request("GET", "/apis/first/x")[0] == 200
    assert gateway.envoy.counters(r"ext_proc\..*streams_started$") == streams


def test_an_issuer_removed_is_refused_on_a_connection_opened_while_it_was_trusted(
    gateway: Estate, idp: DevIdentityProvider
) -> None:
    """The listener holds the issuers' keys (jwt_authn), so removing an issuer changes it: the old
    listener would still verify the removed issuer's tokens. The route checks the issuer again."""
    admin = gateway.admin
    with DevIdentityProvider(audience=AUDIENCE) as second:
        admin.create_tenant(TENANT, exist_ok=True)
        admin.add_issuer(TENANT, idp.issuer, jwks=idp.jwks())
        removed = admin.add_issuer(TENANT, second.issuer, jwks=second.jwks())
        gateway.publish("vault", tenant_id=TENANT, auth={"mode": "jwt", "scopes": []})
        admin.wait_synced()
        kept_token = {"authorization": f"Bearer {idp.mint(tenant=TENANT)}"}
        removed_token = {"authorization": f"Bearer {second.mint(tenant=TENANT)}"}
        connection = Connection(gateway)
        try:
            assert connection.request("GET", "/apis/vault/x", headers=kept_token)[0] == 200
            assert connection.request("GET", "/apis/vault/x", headers=removed_token)[0] == 200
            admin.delete_issuer(TENANT, removed["issuer_id"])
            admin.wait_synced()
            status, _ = connection.request("GET", "/apis/vault/x", headers=removed_token)
            assert status == 401, "a removed issuer's token was accepted"
            assert connection.request("GET", "/apis/vault/x", headers=kept_token)[0] == 200
        finally:
            connection.close()


@pytest.fixture(scope="module")
def scoped_gateway(estates: Callable[..., Estate]) -> Estate:
    """Routes by scope (delta xDS), the listener replaced whenever the routing switches."""
    return estates(
        EstateOptions(link_env={"STOA_LINK_XDS": "delta"}, envoy_drain_time_s=DRAIN_TIME_S),
        "estate-open-connections-scoped",
    )


def test_policies_apply_on_a_connection_opened_before_the_routing_switched(scoped_gateway: Estate) -> None:
    """An API whose prefix cannot be keyed puts the gateway's routes in one table, so the listener
    names that table instead of the scopes, and its removal switches back: a connection opened
    before either switch is still read by the listener that accepted it."""
    gateway, admin = scoped_gateway, scoped_gateway.admin
    open_auth = {"mode": "none", "scopes": []}
    gateway.publish("before", tenant_id=TENANT, auth=open_auth)
    admin.wait_synced()
    with contextlib.ExitStack() as opened:

        def connection() -> Connection:
            """A new connection to the gateway, closed when the test ends."""
            made = Connection(gateway)
            opened.callback(made.close)
            return made

        on_scopes = connection()
        assert on_scopes.request("GET", "/apis/before/x")[0] == 200
        gateway.publish("catchall", tenant_id=TENANT, auth=open_auth, path_prefix="/catchall")
        admin.wait_synced()
        assert routing(gateway) == "one table"
        on_one_table = connection()
        assert on_one_table.request("GET", "/catchall/x")[0] == 200
        fence = {"mode": "deny", "ip_list": ["127.0.0.0/8"]}
        admin.add_policy("fence", "ip_filter", fence, tenant_id=TENANT, targets=["before"])
        admin.wait_synced()
        # The scopes that connection's listener read are gone: Envoy answers 404 there.
        assert on_scopes.request("GET", "/apis/before/x")[0] == 404
        assert connection().request("GET", "/apis/before/x")[0] == 403
        admin.undeploy("catchall")
        gateway.publish("after", tenant_id=TENANT, auth=open_auth)
        admin.wait_synced()
        assert routing(gateway) == "scoped"
        # The one table as that connection knew it held both; it must keep neither of them.
        for path in ("/catchall/x", "/apis/before/x"):
            status, content = on_one_table.request("GET", path)
            assert status == 503, f"{path}: a connection opened on the one table was served by it as it was"
            assert json.loads(content) == json.loads(DENY_BODIES[503])
        fresh = connection()
        assert fresh.request("GET", "/catchall/x")[0] == 404
        assert fresh.request("GET", "/apis/before/x")[0] == 403
        assert fresh.request("GET", "/apis/after/x")[0] == 200


def routing(estate: Estate) -> str:
    """How the Link routes: "scoped" or "one table" (its readiness says)."""
    assert estate.site is not None
    return httpx.get(f"{estate.site.link_http_url}/health/ready", timeout=5).json()["routing"]
