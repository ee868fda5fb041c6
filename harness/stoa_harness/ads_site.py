"""An ADS site in-process: the Link's own ADS server, Agent and reporter on an event loop in a
background thread, a real Envoy connected over mutual TLS, and a scripted CP receiving the reporter's
sync reports (`stoa_harness.scripted_cp`); plus hand-made snapshots built with xds-protos, so a test controls
exactly what Envoy is given (and can make Envoy refuse one).

    site = AdsSite(root)                                   # ADS server + Agent + a real Envoy
    site.apply(2, make_snapshot(2, [make_cluster("a", port)], make_listener(site.listener_port),
                                make_routes([("/a", "a")])))   # -> the SyncReport
    site.cp.wait_report(2, "SYNCED")                       # what the CP received
    site.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
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
from stoa_link import bootstrap, certs
from stoa_link.ads import AdsServer, PublishResult, TlsMaterial
from stoa_link.agent import Agent, InventoryStore
from stoa_link.reporter import Reporter
from stoa_link.settings import LinkSettings
from stoa_proto import inventory_pb2
from stoa_translate.snapshot import CLUSTER, ENVOY_TYPES, LISTENER, ROUTE, Snapshot

from stoa_harness.envoy import EnvoyProcess
from stoa_harness.ports import free_port
from stoa_harness.scripted_cp import ScriptedCP

GATEWAY = "gw-ads"
CREDENTIAL = "gateway-credential"
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


class AdsSite:
    """ADS server + Agent + reporter (in-process) and a real Envoy connected over mTLS."""

    def __init__(self, root: Path, xds: Literal["sotw", "delta"] = "sotw") -> None:
        """`xds`: the variant Envoy's bootstrap asks for (state of the world or incremental)."""
        self.root = root
        self.xds = xds
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
        self.cp = ScriptedCP(GATEWAY, CREDENTIAL).start()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self.ads_port = self.loop.run(self.ads.start())

        async def _link() -> tuple[Reporter, Agent]:
            reporter = Reporter(self.cp.url, GATEWAY, CREDENTIAL)
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
            xds=self.xds,
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
        self.cp.stop()
