"""The Link's operator endpoint: its series, read back with prometheus-client's parser, and the HTTP
answers over a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from prometheus_client.parser import text_string_to_metric_families
from stoa_harness.metrics import samples
from stoa_harness.xds_client import XdsClient
from stoa_link import certs
from stoa_link.ads import AdsServer, TlsMaterial
from stoa_link.agent import Agent, InventoryStore
from stoa_link.health import readiness
from stoa_link.metrics import PublicationStats, link_registry, route_count
from stoa_link.settings import LinkSettings
from stoa_ops.endpoint import CONTENT_TYPE, OperatorEndpoint, exposition
from stoa_proto import inventory_pb2
from stoa_translate.snapshot import CLUSTER, ENVOY_TYPES, LISTENER, ROUTE, SITE_SERVICE_TYPES, Snapshot

ENVOY = "spiffe://stoa.local/envoy"
AUTHZ = "spiffe://stoa.local/ext-authz"


def unstarted_ads() -> AdsServer:
    return AdsServer(
        "127.0.0.1:0", TlsMaterial(b"", b"", b""), {ENVOY: ENVOY_TYPES, AUTHZ: SITE_SERVICE_TYPES}
    )


def scrape(stats: PublicationStats, ads: AdsServer, cp_connected: bool) -> dict[str, float]:
    return samples(exposition(link_registry(stats, ads, lambda: cp_connected)).decode())


def test_link_series_before_anything_happened() -> None:
    got = scrape(PublicationStats(), unstarted_ads(), cp_connected=False)

    assert got["stoa_link_applied_generation"] == 0
    assert got["stoa_link_desired_generation_seen"] == 0
    assert got["stoa_link_routes"] == 0
    assert got["stoa_link_cp_connected"] == 0
    assert got[f'stoa_link_ads_clients{{identity="{ENVOY}"}}'] == 0
    assert got[f'stoa_link_ads_clients{{identity="{AUTHZ}"}}'] == 0
    assert got["stoa_link_publish_seconds_count"] == 0
    assert not any(k.startswith(("stoa_link_publications_total", "stoa_link_nacks_total")) for k in got)
    assert not any(k.endswith("_created") for k in got), "no _created series beside counters"


class _Reports:
    def submit(self, report: inventory_pb2.SyncReport) -> None:
        pass


def test_agent_reports_are_counted_by_outcome_and_reason(tmp_path) -> None:
    agent = Agent("gw", unstarted_ads(), _Reports(), lambda inv: None, InventoryStore(tmp_path))  # type: ignore[arg-type]
    agent.offer(inventory_pb2.Inventory(gateway_id="gw", generation=7))
    agent._report(inventory_pb2.SyncReport(generation=7, status=inventory_pb2.SYNCED), {"total_ms": 120.0})
    agent._report(
        inventory_pb2.SyncReport(generation=8, status=inventory_pb2.FAILED, reason=inventory_pb2.ROUTE_LOSS),
        {"total_ms": 3.0},
    )
    agent._report(
        inventory_pb2.SyncReport(generation=9, status=inventory_pb2.FAILED, reason=inventory_pb2.ROUTE_LOSS)
    )

    got = scrape(agent.stats, agent.ads, cp_connected=True)

    assert got["stoa_link_desired_generation_seen"] == 7
    assert got['stoa_link_publications_total{outcome="synced",reason="none"}'] == 1
    assert got['stoa_link_publications_total{outcome="failed",reason="ROUTE_LOSS"}'] == 2
    # Only reports that timed a delivery are observed (an invalid document has nothing to time).
    assert got["stoa_link_publish_seconds_count"] == 2
    assert got["stoa_link_publish_seconds_sum"] == pytest.approx(0.123)
    assert got['stoa_link_publish_seconds_bucket{le="0.05"}'] == 1
    assert got['stoa_link_publish_seconds_bucket{le="0.25"}'] == 2
    assert got['stoa_link_publish_seconds_bucket{le="+Inf"}'] == 2
    assert got["stoa_link_cp_connected"] == 1


async def test_routes_are_counted_across_virtual_hosts_of_the_acknowledged_snapshot(tmp_path) -> None:
    certs.write_dev_certs(tmp_path, ENVOY, "")
    ads = AdsServer("127.0.0.1:0", TlsMaterial.server_from_dir(tmp_path), {ENVOY: ENVOY_TYPES}, 5.0)
    await ads.start()
    envoy = XdsClient(tmp_path, ads.port)
    try:
        envoy.subscribe(CLUSTER, LISTENER, ROUTE)
        config = route_pb2.RouteConfiguration(
            name="stoa-routes",
            virtual_hosts=[
                rc.VirtualHost(name="a", routes=[rc.Route(name="1"), rc.Route(name="2")]),
                rc.VirtualHost(name="b", routes=[rc.Route(name="3")]),
            ],
        )
        assert route_count(ads) == 0

        result = await ads.publish(Snapshot.build("gw", 3, {ROUTE: [config]}))

        assert result.acked
        got = scrape(PublicationStats(), ads, cp_connected=True)
        assert got["stoa_link_routes"] == 3
        assert got["stoa_link_applied_generation"] == 3
        assert got[f'stoa_link_ads_clients{{identity="{ENVOY}"}}'] == 1
    finally:
        await envoy.close()
        await ads.stop(0)


@pytest.fixture
async def endpoint() -> AsyncIterator[str]:
    ads = unstarted_ads()
    endpoints = OperatorEndpoint(
        lambda: readiness(ads), link_registry(PublicationStats(), ads, lambda: False)
    )
    server = await endpoints.start("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.close()
    await server.wait_closed()


async def test_the_links_readiness_and_series_over_http(endpoint: str) -> None:
    # The endpoint's own rules (live, 404, 405, HEAD) are the operator endpoint's tests'.
    async with httpx.AsyncClient(base_url=endpoint) as client:
        ready = await client.get("/health/ready")
        scraped = await client.get("/metrics")

    assert ready.status_code == 503
    assert ready.json()["status"] == "not_ready"
    assert ENVOY in ready.json()["reason"]
    assert AUTHZ in ready.json()["reason"]
    assert ready.json()["clients"] == {ENVOY: 0, AUTHZ: 0}
    assert scraped.status_code == 200
    assert scraped.headers["content-type"] == CONTENT_TYPE
    assert {f.name: f.type for f in text_string_to_metric_families(scraped.text)}[
        "stoa_link_publications"
    ] == ("counter")
    assert samples(scraped.text)["stoa_link_applied_generation"] == 0


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:9902", ("127.0.0.1", 9902)), ("0.0.0.0:9902", ("0.0.0.0", 9902)), ("", None)],
)
def test_http_address_setting(address: str, expected: tuple[str, int] | None) -> None:
    assert LinkSettings(http_address=address).http_endpoint == expected


@pytest.mark.parametrize("address", ["localhost:9902", "127.0.0.1", "127.0.0.1:99999"])
def test_bad_http_address_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="HTTP address"):
        LinkSettings(http_address=address)


def test_http_address_defaults_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOA_LINK_HTTP_ADDRESS", raising=False)
    assert LinkSettings().http_endpoint == ("127.0.0.1", 9902)
