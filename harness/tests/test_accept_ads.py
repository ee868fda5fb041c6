"""The Link's ADS server against a real Envoy: bring-up, NACK, identities, loopback, removal order.

The snapshots are built by hand with xds-protos (so a test controls exactly what Envoy is given and
can make Envoy refuse one); the Agent, the reporter and the ADS server are the Link's own, running on
an event loop in a background thread, reporting to a small local HTTP receiver that stands in for the CP.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Coroutine, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, config_source_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.local_ratelimit.v3 import local_rate_limit_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from envoy.type.matcher.v3 import regex_pb2
from google.protobuf import any_pb2, duration_pb2
from stoa_harness.envoy import EnvoyProcess
from stoa_harness.ports import free_port
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until
from stoa_link import bootstrap, certs
from stoa_link.ads import AdsServer, PublishResult, TlsMaterial
from stoa_link.agent import Agent, InventoryStore
from stoa_link.reporter import Reporter
from stoa_link.settings import LinkSettings
from stoa_proto import inventory_pb2
from stoa_translate.snapshot import CLUSTER, ENVOY_TYPES, LISTENER, ROUTE, Snapshot

GATEWAY = "gw-ads"
ENVOY_SAN = "spiffe://stoa.local/envoy"
T = TypeVar("T")


# ---- hand-made snapshots -------------------------------------------------------------------------


def _any(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def make_cluster(name: str, port: int) -> cluster_pb2.Cluster:
    endpoint = endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(
            address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(address="127.0.0.1", port_value=port)
            )
        )
    )
    return cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STATIC,
        connect_timeout=duration_pb2.Duration(seconds=1),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[endpoint])],
        ),
    )


def make_listener(port: int, ratelimit_without_stat_prefix: bool = False) -> listener_pb2.Listener:
    filters = []
    if ratelimit_without_stat_prefix:  # Envoy NACKs this on LDS (stat_prefix is required)
        filters.append(
            hcm.HttpFilter(
                name="envoy.filters.http.local_ratelimit",
                typed_config=_any(local_rate_limit_pb2.LocalRateLimit()),
            )
        )
    filters.append(hcm.HttpFilter(name="envoy.filters.http.router", typed_config=_any(router_pb2.Router())))
    manager = hcm.HttpConnectionManager(
        stat_prefix="ingress",
        rds=hcm.Rds(
            config_source=config_source_pb2.ConfigSource(
                ads=config_source_pb2.AggregatedConfigSource(),
                resource_api_version=config_source_pb2.V3,
            ),
            route_config_name="stoa-routes",
        ),
        http_filters=filters,
    )
    return listener_pb2.Listener(
        name="stoa-listener",
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(address="127.0.0.1", port_value=port)
        ),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name="envoy.filters.network.http_connection_manager", typed_config=_any(manager)
                    )
                ]
            )
        ],
    )


def make_routes(entries: list[tuple[str, str]], bad_regex: bool = False) -> route_pb2.RouteConfiguration:
    routes = []
    if bad_regex:  # Envoy NACKs this on RDS (not valid RE2)
        routes.append(
            route_components_pb2.Route(
                match=route_components_pb2.RouteMatch(safe_regex=regex_pb2.RegexMatcher(regex="/broken(")),
                direct_response=route_components_pb2.DirectResponseAction(status=418),
            )
        )
    for prefix, cluster in entries:
        routes.append(
            route_components_pb2.Route(
                match=route_components_pb2.RouteMatch(prefix=prefix),
                route=route_components_pb2.RouteAction(cluster=cluster),
            )
        )
    return route_pb2.RouteConfiguration(
        name="stoa-routes",
        virtual_hosts=[route_components_pb2.VirtualHost(name="all", domains=["*"], routes=routes)],
    )


def make_snapshot(
    generation: int,
    clusters: list[cluster_pb2.Cluster],
    listener: listener_pb2.Listener,
    routes: route_pb2.RouteConfiguration,
) -> Snapshot:
    return Snapshot.build(GATEWAY, generation, {CLUSTER: clusters, LISTENER: [listener], ROUTE: [routes]})


# ---- the Link side, on its own event loop ------------------------------------------------------------


class LoopThread:
    """An asyncio loop in a daemon thread; tests submit coroutines and wait for their results."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="link-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(_cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class ReportReceiver:
    """Stands in for the CP's sync-report endpoint: records every JSON body POSTed to it."""

    def __init__(self) -> None:
        received: list[dict[str, Any]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), **json.loads(body)}
                )
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reports_for(self, generation: int) -> list[dict[str, Any]]:
        return [r for r in self.received if int(r.get("generation", 0)) == generation]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Site:
    """ADS server + Agent + reporter (in-process) and a real Envoy connected over mTLS."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tls_dir = root / "tls"
        certs.write_dev_certs(self.tls_dir, ENVOY_SAN, "")
        self.listener_port = free_port()
        self.snapshots: dict[int, Snapshot] = {}
        self.envoys: list[EnvoyProcess] = []
        self.envoy: EnvoyProcess | None = None  # the site's own Envoy, once started
        self.ads = AdsServer(
            "127.0.0.1:0",
            TlsMaterial.server_from_dir(self.tls_dir),
            {ENVOY_SAN: ENVOY_TYPES},
            ack_timeout_s=10.0,
        )
        self.loop = LoopThread()
        self.receiver = ReportReceiver()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self.ads_port = self.loop.run(self.ads.start())

        async def _link() -> tuple[Reporter, Agent]:
            reporter = Reporter(self.receiver.url, GATEWAY, "gateway-credential")
            agent = Agent(
                GATEWAY,
                self.ads,
                reporter,
                lambda inv: self.snapshots[inv.generation],
                InventoryStore(self.root / "state"),
            )
            asyncio.get_running_loop().create_task(reporter.run())
            return reporter, agent

        self.reporter, self.agent = self.loop.run(_link())
        self.envoy = self.start_envoy("envoy", self.tls_dir)

    def settings(self, tls_dir: Path, admin_port: int) -> LinkSettings:
        return LinkSettings(
            ads_address=f"127.0.0.1:{self.ads_port}",
            tls_dir=tls_dir,
            envoy_admin_port=admin_port,
            gateway_id=GATEWAY,
        )

    def start_envoy(self, name: str, tls_dir: Path) -> EnvoyProcess:
        admin_port = free_port()
        path = self.root / f"{name}.yaml"
        bootstrap.write(self.settings(tls_dir, admin_port), path, node_id=name)
        envoy = EnvoyProcess(path, admin_port, self.root / f"{name}.log")
        self.envoys.append(envoy)
        return envoy.start()

    def apply(self, generation: int, snapshot: Snapshot) -> inventory_pb2.SyncReport | None:
        self.snapshots[generation] = snapshot
        inventory = inventory_pb2.Inventory(gateway_id=GATEWAY, generation=generation)
        return self.loop.run(self.agent.apply(inventory))

    def publish(self, snapshot: Snapshot) -> PublishResult:
        return self.loop.run(self.ads.publish(snapshot))

    @property
    def own_envoy(self) -> EnvoyProcess:
        assert self.envoy is not None
        return self.envoy

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.listener_port}{path}", timeout=5.0)

    def close(self) -> None:
        for envoy in self.envoys:
            envoy.stop()
        self.loop.run(self.ads.stop(0))
        self.loop.close()
        self.receiver.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[EchoUpstream]:
    with EchoUpstream() as echo:
        yield echo


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, upstream: EchoUpstream) -> Iterator[Site]:
    site = Site(tmp_path_factory.mktemp("ads-site"))
    try:
        report = site.apply(
            1,
            make_snapshot(
                1,
                [make_cluster("backend_a", upstream.port)],
                make_listener(site.listener_port),
                make_routes([("/a", "backend_a")]),
            ),
        )
        assert report is not None
        assert report.status == inventory_pb2.SYNCED, report
        wait_until(
            lambda: site.get("/a/ready").status_code == 200, 10, "the first route serving through Envoy"
        )
        yield site
    finally:
        site.close()


# ---- the tests ---------------------------------------------------------------------------------------


def test_bring_up_acks_cds_lds_rds_and_reports_synced(site: Site, upstream: EchoUpstream) -> None:
    version = site.snapshots[1].version
    envoy = site.own_envoy
    assert envoy.versions() == {"cds": version, "lds": version, "rds": version}
    acked = {(e.type_url, e.version) for e in site.ads.event_log() if e.kind == "ack"}
    assert {(CLUSTER, version), (LISTENER, version), (ROUTE, version)} <= acked
    wait_until(lambda: site.receiver.reports_for(1), 10, "the SYNCED report for generation 1")
    [report] = site.receiver.reports_for(1)
    assert report["status"] == "SYNCED"
    assert report["snapshot_version"] == version
    assert report["path"] == f"/v1/gateways/{GATEWAY}/sync-reports"
    assert report["auth"] == "Bearer gateway-credential"
    upstream.clear()
    assert site.get("/a/hello").status_code == 200
    assert upstream.wait_arrivals(1, path_prefix="/a/hello")[0].path == "/a/hello"


@pytest.mark.parametrize(
    ("generation", "bad", "failed_type", "detail_fragment"),
    [(2, "regex", ROUTE, "missing ): /broken("), (3, "ratelimit", LISTENER, "statprefix")],
)
def test_snapshot_envoy_rejects_is_nacked_reported_failed_and_old_config_serves(
    site: Site, upstream: EchoUpstream, generation: int, bad: str, failed_type: str, detail_fragment: str
) -> None:
    good = site.snapshots[1].version
    rejected = make_snapshot(
        generation,
        [make_cluster("backend_a", upstream.port)],
        make_listener(site.listener_port, ratelimit_without_stat_prefix=bad == "ratelimit"),
        make_routes([("/a", "backend_a"), ("/b", "backend_a")], bad_regex=bad == "regex"),
    )
    report = site.apply(generation, rejected)
    assert report is not None
    assert report.status == inventory_pb2.FAILED
    assert inventory_pb2.FailureReason.Name(report.reason) == "NACK"
    assert detail_fragment in report.detail.lower()
    nacks = [e for e in site.ads.event_log() if e.kind == "nack" and e.version == rejected.version]
    assert [e.type_url for e in nacks] == [failed_type]
    # The reporter delivered it to the CP stand-in, with Envoy's own words.
    wait_until(
        lambda: site.receiver.reports_for(generation), 10, f"the FAILED report for generation {generation}"
    )
    [sent] = site.receiver.reports_for(generation)
    assert sent["status"] == "FAILED"
    assert sent["reason"] == "NACK"
    assert detail_fragment in sent["detail"].lower()
    # The previous snapshot is back everywhere and still serves; the rejected route does not exist.
    envoy = site.own_envoy
    wait_until(
        lambda: envoy.versions() == {"cds": good, "lds": good, "rds": good},
        10,
        "Envoy back on the old version",
    )
    assert site.ads.served_version(ROUTE) == good
    assert site.ads.served_version(LISTENER) == good
    assert site.get("/a/still").status_code == 200
    assert site.get("/b/never").status_code == 404
    assert site.agent.last_applied is not None
    assert site.agent.last_applied.generation == 1


def test_clusters_leave_only_after_the_routes_that_stop_using_them_are_acked(
    site: Site, upstream: EchoUpstream
) -> None:
    start = site.ads.event_log()[-1].seq
    moved = make_snapshot(
        10,
        [make_cluster("backend_b", upstream.port)],
        make_listener(site.listener_port),
        make_routes([("/a", "backend_b")]),
    )
    report = site.apply(10, moved)
    assert report is not None
    assert report.status == inventory_pb2.SYNCED, report
    events = [e for e in site.ads.event_log() if e.seq > start]
    cds_sends = [e for e in events if e.kind == "send" and e.type_url == CLUSTER]
    # First the union (old and new clusters), then the new set alone.
    assert [set(e.names) for e in cds_sends] == [{"backend_a", "backend_b"}, {"backend_b"}]
    removal = cds_sends[1]
    [rds_ack] = [e for e in events if e.kind == "ack" and e.type_url == ROUTE and e.version == moved.version]
    assert rds_ack.seq < removal.seq
    envoy = site.own_envoy
    wait_until(lambda: envoy.versions()["cds"] == moved.version, 10, "Envoy on the final CDS")
    names = {c["cluster"]["name"] for c in envoy.config_dump("dynamic_active_clusters")["configs"]}
    assert names == {"backend_b"}
    assert site.get("/a/moved").status_code == 200


def test_envoy_with_another_uri_san_gets_no_configuration(site: Site) -> None:
    intruder_dir = site.root / "intruder-tls"
    intruder_dir.mkdir()
    issued = certs.issue_client(certs.load_ca(site.tls_dir), "spiffe://stoa.local/intruder")
    (intruder_dir / certs.ENVOY_CERT_FILE).write_bytes(issued.cert_pem)
    (intruder_dir / certs.ENVOY_KEY_FILE).write_bytes(issued.key_pem)
    (intruder_dir / certs.CA_FILE).write_bytes((site.tls_dir / certs.CA_FILE).read_bytes())
    intruder = site.start_envoy("intruder", intruder_dir)
    try:
        wait_until(
            lambda: any(
                e.kind == "refuse" and e.identity == "spiffe://stoa.local/intruder"
                for e in site.ads.event_log()
            ),
            10,
            "the ADS server refusing the intruder",
        )
        dump = intruder.config_dump()
        listeners = [s for s in dump["configs"] if s["@type"].endswith("ListenersConfigDump")]
        assert all(not s.get("dynamic_listeners") for s in listeners)
        clusters = [s for s in dump["configs"] if s["@type"].endswith("ClustersConfigDump")]
        assert all(not s.get("dynamic_active_clusters") for s in clusters)
        assert site.ads.connected("spiffe://stoa.local/intruder") == 0
    finally:
        intruder.stop()


def test_envoy_connecting_later_gets_the_acknowledged_snapshot(site: Site) -> None:
    current = site.ads.acked_snapshot
    assert current is not None
    late = site.start_envoy("late-envoy", site.tls_dir)
    try:
        wait_until(
            lambda: (
                late.versions() == {"cds": current.version, "lds": current.version, "rds": current.version}
            ),
            10,
            "the late Envoy on the current version",
        )
    finally:
        late.stop()
    wait_until(lambda: site.ads.connected(ENVOY_SAN) == 1, 10, "the late Envoy's stream to close")


@pytest.mark.parametrize("address", ["0.0.0.0:18000", "192.0.2.10:18000", "[::]:18000", "localhost:18000"])
def test_non_loopback_ads_bind_refuses_to_start(tmp_path: Path, address: str) -> None:
    env = {
        **os.environ,
        "STOA_LINK_ADS_ADDRESS": address,
        "STOA_LINK_CP_URL": "http://127.0.0.1:9",
        "STOA_LINK_GATEWAY_ID": GATEWAY,
        "STOA_LINK_GATEWAY_CREDENTIAL": "x",
        "STOA_LINK_TLS_DIR": str(tmp_path),
        "STOA_LINK_STATE_DIR": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "stoa_link.cli", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "STOA_LINK_ADS_ADDRESS" in proc.stderr
    assert "loopback" in proc.stderr
    with pytest.raises(ValueError, match="loopback"):
        AdsServer(address, TlsMaterial(b"", b"", b""), {ENVOY_SAN: ENVOY_TYPES})
