"""Zero non-2xx while routes change, on both xDS variants (issue 14). Five rounds of add / modify /
reorder / switch-backend on 20 routes, while clients hit every published route continuously through a
real Envoy (the witness allowing everything). The last round moves every route off the first backend,
so its cluster must leave only after the route configuration that stops using it is acknowledged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until

TENANT = "churn"
ROUTES = 20
ROUNDS = 5
CLIENTS = 2
CLIENT_TIMEOUT_MS = 10_000


@pytest.fixture(scope="module", params=["sotw", "delta"])
def estate(request: pytest.FixtureRequest, estates: Callable[..., Estate]) -> Estate:
    """The churn runs once with Envoy on state-of-the-world xDS and once on incremental (delta) xDS.

    The Check witness answers on this test's own process, beside the clients sweeping every route:
    on a loaded machine it can miss the Link's default 250 ms Check deadline, and Envoy's 503 for
    that (UAEX: Retry-After and the neutral body) says nothing about routes changing. A Check here
    has the clients' own deadline; timing out a slow Check is test_accept_chain's.
    """
    link_env = {"STOA_LINK_XDS": request.param, "STOA_LINK_EXT_AUTHZ_TIMEOUT_MS": str(CLIENT_TIMEOUT_MS)}
    return estates(EstateOptions(link_env=link_env), name=f"churn-{request.param}")


@pytest.fixture(scope="module")
def backend_b() -> Iterator[EchoUpstream]:
    with EchoUpstream() as upstream:
        yield upstream


@dataclass
class Api:
    api_id: str
    upstream_url: str
    path_prefix: str
    methods: list[str] = field(default_factory=lambda: ["GET"])
    timeout_ms: int = 5000

    def body(self) -> dict[str, Any]:
        return {
            "name": self.api_id,
            "upstream_url": self.upstream_url,
            "path_prefix": self.path_prefix,
            "methods": self.methods,
            "timeout_ms": self.timeout_ms,
        }


class Client:
    """Threads that sweep every published URL again and again, recording anything but a 2xx."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._urls: list[str] = []
        self._stop = threading.Event()
        self.failures: list[tuple[str, str]] = []
        self.sent = 0
        self.sweeps = 0
        self.hits: dict[str, int] = {}
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def add(self, *urls: str) -> None:
        with self._lock:
            self._urls.extend(urls)

    def _run(self, index: int) -> None:
        # No keep-alive, like the estate's own client: each request dials Envoy afresh.
        with httpx.Client(
            limits=httpx.Limits(max_keepalive_connections=0), timeout=CLIENT_TIMEOUT_MS / 1000
        ) as http:
            while not self._stop.is_set():
                with self._lock:
                    urls = list(self._urls)
                # Each client sweeps in its own order so different routes are hit at each instant.
                for url in urls if index % 2 == 0 else reversed(urls):
                    try:
                        reply = http.get(url)
                        status = str(reply.status_code)
                        if not status.startswith("2"):
                            # What answered, for the failure message: Envoy's own replies differ by cause.
                            retry_after = reply.headers.get("retry-after")
                            status += f" retry-after={retry_after} {reply.content[:80]!r}"
                    except httpx.HTTPError as exc:
                        status = repr(exc)
                    with self._lock:
                        self.sent += 1
                        self.hits[url] = self.hits.get(url, 0) + 1
                        if not status.startswith("2"):
                            self.failures.append((url, status))
                with self._lock:
                    self.sweeps += 1

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def wait_sweeps(self, count: int) -> None:
        with self._lock:
            target = self.sweeps + count
        wait_until(lambda: self.sweeps >= target, 30, f"{count} more sweep(s) of every route")


def served_by(estate: Estate, api: Api, backend_path: str) -> bool:
    reply = estate.gateway.get(estate.url(f"{api.path_prefix}/probe"))
    return reply.status_code == 200 and reply.json()["path"] == f"{backend_path}/probe"


def backend_clusters(estate: Estate) -> dict[int, str]:
    """Upstream port → name of each backend cluster Envoy holds (one per backend identity)."""
    dump = estate.envoy.config_dump("dynamic_active_clusters")
    by_port: dict[int, str] = {}
    for entry in dump.get("configs", []):
        cluster = entry["cluster"]
        for group in cluster.get("load_assignment", {}).get("endpoints", []):
            for endpoint in group.get("lb_endpoints", []):
                port = int(endpoint["endpoint"]["address"]["socket_address"]["port_value"])
                assert port not in by_port, (
                    f"two clusters for port {port}: {by_port[port]}, {cluster['name']}"
                )
                by_port[port] = cluster["name"]
    return by_port


def test_route_churn_serves_every_request(
    witness_allows: None, estate: Estate, backend_b: EchoUpstream
) -> None:
    a_url, b_url = f"{estate.upstream.url}/a", f"{backend_b.url}/b"
    backend_path = {a_url: "/a", b_url: "/b"}
    estate.admin.create_tenant(TENANT, exist_ok=True)
    apis: dict[str, Api] = {}
    for i in range(ROUTES):
        api = Api(f"churn-{i:02d}", a_url, f"/apis/churn-{i:02d}")
        estate.create_api(api.api_id, tenant_id=TENANT, **api.body())
        estate.admin.deploy(api.api_id)
        apis[api.api_id] = api
    estate.admin.wait_synced()

    client = Client()
    client.add(*(estate.url(f"{api.path_prefix}/x") for api in apis.values()))
    client.start()
    cluster_names: dict[int, str] = {}
    try:
        client.wait_sweeps(CLIENTS)
        for r in range(ROUNDS):
            last = r == ROUNDS - 1
            # add: a new route on the backend of the round
            new = Api(f"churn-new-{r}", b_url if r % 2 else a_url, f"/apis/churn-new-{r}")
            # reorder: a nested, longer prefix sorts ahead of every existing entry of the table
            nested = Api(f"churn-nest-{r}", b_url, f"/apis/churn-{r:02d}/deep")
            for api in (new, nested):
                estate.create_api(api.api_id, tenant_id=TENANT, **api.body())
                estate.admin.deploy(api.api_id)
                apis[api.api_id] = api
            # modify: methods and timeout of a handful of routes
            modified = [apis[f"churn-{i:02d}"] for i in range(r, ROUTES, 5)]
            for api in modified:
                api.methods = ["GET", "POST"] if "POST" not in api.methods else ["GET"]
                api.timeout_ms += 1000
            # switch-backend: a handful each round; in the last, every route leaves backend A
            switched = list(apis.values()) if last else [apis[f"churn-{i:02d}"] for i in range(r, ROUTES, 4)]
            for api in switched:
                api.upstream_url = b_url if last or api.upstream_url == a_url else a_url
            for api in {a.api_id: a for a in (*modified, *switched)}.values():
                estate.admin.update_api(api.api_id, api.body(), tenant_id=TENANT)
            estate.admin.wait_synced()

            for api in apis.values():
                assert served_by(estate, api, backend_path[api.upstream_url]), (r, api)
            for api in modified:
                posted = estate.gateway.post(estate.url(f"{api.path_prefix}/x"), content=b"{}")
                assert posted.status_code == (200 if "POST" in api.methods else 404), (r, api)
            client.add(estate.url(f"{new.path_prefix}/x"), estate.url(f"{nested.path_prefix}/x"))
            client.wait_sweeps(CLIENTS)

            # Cluster names follow backend identity: a route edit never renames a cluster.
            for port, name in backend_clusters(estate).items():
                assert cluster_names.setdefault(port, name) == name, (r, port)
    finally:
        client.stop()

    assert client.failures == [], f"{len(client.failures)} of {client.sent} requests failed"
    assert client.sent > ROUNDS * ROUTES * CLIENTS
    assert all(client.hits.get(estate.url(f"{api.path_prefix}/x")) for api in apis.values())
    # Backend A is no longer used by any route: its cluster is gone, B's remains.
    clusters = backend_clusters(estate)
    assert estate.upstream.port not in clusters
    assert backend_b.port in clusters
