"""What the rendered configuration does in a real Envoy (static bootstrap, no ADS): matching, rewrite,
hardening and the ext_authz failure reply. One Envoy, one echo upstream, one Check witness per module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from google.protobuf import json_format
from stoa_harness.envoy import EnvoyProcess
from stoa_harness.ports import free_port
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until
from stoa_harness.witness import CheckWitness
from stoa_proto import inventory_pb2
from stoa_proto.bodies import DENY_BODIES
from stoa_translate import TranslateOptions, translate
from stoa_translate.policy_set import merged, route_version
from stoa_translate.snapshot import AUTHZ_POLICY_SET
from stoa_translate.static import static_bootstrap


class Site:
    def __init__(
        self, url: str, upstream: EchoUpstream, witness: CheckWitness, route_versions: dict[str, str]
    ) -> None:
        self.url = url
        self.upstream = upstream
        self.witness = witness
        self.route_versions = route_versions

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        self.upstream.clear()
        self.witness.clear()
        return httpx.get(self.url + path, timeout=5.0, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=[False, True], ids=["one-table", "scoped"])
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """Every test runs on one route table and on route scopes (the Envoy on delta xDS), inlined."""
    tmp: Path = tmp_path_factory.mktemp("translate-envoy")
    with EchoUpstream() as upstream, CheckWitness() as witness:
        base = f"http://127.0.0.1:{upstream.port}"
        doc = {
            "gateway_id": "gw-1",
            "generation": "1",
            "routes": [
                {
                    "route_id": "a",
                    "tenant_id": "t",
                    "api_id": "a",
                    "path_prefix": "/apis/a",
                    "methods": ["GET"],
                    "upstream_url": base + "/base",
                },
                {
                    "route_id": "ab",
                    "tenant_id": "t",
                    "api_id": "ab",
                    "path_prefix": "/apis/ab",
                    "methods": ["GET"],
                    "upstream_url": base,
                },
            ],
        }
        inventory = json_format.ParseDict(doc, inventory_pb2.Inventory())
        port, admin_port = free_port(), free_port()
        options = TranslateOptions(
            listener_port=port, ext_authz_address=witness.address, route_scopes=request.param
        )
        snapshot = translate(inventory, options)
        bootstrap = tmp / "bootstrap.json"
        bootstrap.write_text(json.dumps(static_bootstrap({"t": (snapshot, port)}, admin_port)))
        with EnvoyProcess(bootstrap, admin_port, tmp / "envoy.log"):
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: _answers(url), 15, "the Envoy listener")
            policy_set = merged(snapshot.of(AUTHZ_POLICY_SET))
            yield Site(url, upstream, witness, {r.route_id: route_version(r) for r in policy_set.routes})


def _answers(url: str) -> bool:
    try:
        httpx.get(url + "/", timeout=1.0)
    except httpx.TransportError:
        return False
    return True


@pytest.mark.parametrize(
    ("path", "upstream_path"),
    [
        ("/apis/a", "/base"),
        ("/apis/a/x/y?q=1", "/base/x/y"),
        ("/apis/ab/z", "/z"),
        ("/apis/ab", "/"),
        ("/apis//a///x", "/base/x"),
        ("/apis/a/../ab/z", "/z"),
    ],
)
def test_prefix_match_and_rewrite(site: Site, path: str, upstream_path: str) -> None:
    response = site.get(path)
    assert response.status_code == 200, response.text
    (arrival,) = site.upstream.arrivals()
    assert arrival.path == upstream_path
    (check,) = site.witness.checks()
    assert check.context_extensions["route_id"] == ("a" if upstream_path.startswith("/base") else "ab")


@pytest.mark.parametrize(("path", "route_id"), [("/apis/a/x", "a"), ("/apis/ab/x", "ab")])
def test_check_carries_the_routes_keys_and_its_entrys_version(site: Site, path: str, route_id: str) -> None:
    assert site.get(path).status_code == 200
    (check,) = site.witness.checks()
    assert dict(check.context_extensions) == {
        "tenant_id": "t",
        "api_id": route_id,
        "route_id": route_id,
        "route_version": site.route_versions[route_id],
    }


@pytest.mark.parametrize(
    ("path", "route_id"), [("/apis/a?q=1", "a"), ("/apis/ab?x=/a", "ab"), ("/apis/a/x?y=1", "a")]
)
def test_the_query_string_never_changes_the_route_and_a_client_key_header_is_ignored(
    site: Site, path: str, route_id: str
) -> None:
    # Under scopes the key is the path's API segment without the query (a `:path` key would read
    # `a?q=1`); a client's own x-stoa-route-key is replaced before routing and never reaches upstream.
    response = site.get(path, headers={"x-stoa-route-key": "/apis/ab/x"})
    assert response.status_code == 200, response.text
    (check,) = site.witness.checks()
    assert check.context_extensions["route_id"] == route_id
    (arrival,) = site.upstream.arrivals()
    assert "x-stoa-route-key" not in arrival.headers


@pytest.mark.parametrize("path", ["/apis/abc", "/apis", "/apis/a-b", "/other"])
def test_prefix_boundary(site: Site, path: str) -> None:
    assert site.get(path).status_code == 404
    assert site.upstream.arrivals() == []


def test_method_not_allowed_is_not_routed(site: Site) -> None:
    site.upstream.clear()
    assert httpx.post(site.url + "/apis/a/x", timeout=5.0).status_code == 404
    assert site.upstream.arrivals() == []


@pytest.mark.parametrize("path", ["/apis/a/x%2Fy", "/apis/a/x%2fy", "/apis/a/x%5Cy"])
def test_escaped_slashes_are_rejected(site: Site, path: str) -> None:
    assert site.get(path).status_code == 400
    assert site.upstream.arrivals() == []
    assert site.witness.checks() == []


def test_headers_with_underscores_are_rejected(site: Site) -> None:
    assert site.get("/apis/a/x", headers={"x_tenant_id": "evil"}).status_code == 400
    assert site.upstream.arrivals() == []


def test_client_envoy_headers_are_not_honoured(site: Site) -> None:
    forged = {
        "x-envoy-original-path": "/admin",
        "x-envoy-internal": "true",
        "x-envoy-force-trace": "true",
        "x-forwarded-for": "10.9.9.9",
    }
    assert site.get("/apis/a/x", headers=forged).status_code == 200
    (arrival,) = site.upstream.arrivals()
    assert arrival.header("x-envoy-original-path") is None
    assert arrival.header("x-envoy-internal") is None
    assert arrival.header("x-envoy-force-trace") is None
    # The direct peer is the client address; a forged forwarded-for is not trusted as one.
    assert arrival.header("x-envoy-external-address") == "127.0.0.1"


def test_authz_timeout_is_a_503_with_the_neutral_body(site: Site) -> None:
    site.upstream.clear()
    site.witness.hang()
    try:
        response = httpx.get(site.url + "/apis/a/x", timeout=5.0)
    finally:
        site.witness.release()
    assert response.status_code == 503
    assert response.content == DENY_BODIES[503] == DENY_BODIES[403]
    assert response.headers["content-type"] == "application/json"
    assert 1 <= int(response.headers["retry-after"]) <= 10
    assert site.upstream.arrivals() == []
