"""The bench rig: the estate (CP + Link + Envoy + stoa-authz + stoa-proc and the fake model) plus
what the benchmarks need around it.

- A fast upstream: a second Envoy (one worker thread) answering `direct_response` 200 on three
  listeners (backends A, B, C). The Python echo upstream tops out far below Envoy and would make
  every data-path ratio a measure of the echo server instead of the authorization hop.
- A proxy-only listener in the SAME Envoy as the Link's listener: merged into its bootstrap with
  `--config-yaml` (a static listener without ext_authz routing to backend A). Same Envoy process,
  same worker threads, same upstream: the only difference from a Link route is the ext_authz filter.
- The dev identity provider, registered as the trusted issuer of tenant `demo`.
- Bulk seeding and bulk undeployment through the CP's public bulk endpoint
  (`POST /v1/tenants/{tenant_id}/bulk`): thousands of routes in one generation, where one call per
  deployment would be serialised on the gateway row (≈100 routes/s here). The measured single
  publications go through the single calls.
- Process CPU time and RSS read from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from stoa_harness.cp_client import AsyncCPClient
from stoa_harness.envoy import EnvoyProcess
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.ports import free_port
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import wait_until

AUDIENCE = "stoa-bench"
TENANT = "demo"
SCOPE = "bench:read"
SEED_CONCURRENCY = 16
CLK_TCK = os.sysconf("SC_CLK_TCK")
HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def http_listener(name: str, port: int, route: dict[str, Any]) -> dict[str, Any]:
    """A static Envoy listener: one HTTP connection manager, one catch-all route, the router filter."""
    manager = {
        "@type": HCM_TYPE,
        "stat_prefix": name,
        "route_config": {
            "virtual_hosts": [
                {"name": name, "domains": ["*"], "routes": [{"match": {"prefix": "/"}, **route}]}
            ]
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER_TYPE}}],
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
        ],
    }


OK_RESPONSE = {"direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}


class FastUpstream:
    """A second Envoy answering 200 on one port per backend (one worker thread, so it takes a bounded
    share of the two cores)."""

    def __init__(self, run_dir: Path, backends: Sequence[str] = ("a", "b", "c")) -> None:
        self.ports = {name: free_port() for name in backends}
        self.admin_port = free_port()
        bootstrap = {
            "node": {"id": "bench-upstream", "cluster": "bench"},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin_port}}},
            "static_resources": {
                "listeners": [http_listener(f"backend_{n}", p, OK_RESPONSE) for n, p in self.ports.items()]
            },
        }
        path = run_dir / "fast-upstream.json"
        path.write_text(json.dumps(bootstrap))
        self.envoy = EnvoyProcess(
            path, self.admin_port, run_dir / "fast-upstream.log", extra_args=("--concurrency", "1")
        )

    def url(self, backend: str = "a") -> str:
        return f"http://127.0.0.1:{self.ports[backend]}"

    def __enter__(self) -> FastUpstream:
        self.envoy.start()
        for port in self.ports.values():
            wait_until(
                lambda p=port: httpx.get(f"http://127.0.0.1:{p}/").status_code == 200,
                10,
                f"fast upstream on {port}",
            )
        return self

    def __exit__(self, *_exc: object) -> None:
        self.envoy.stop()


def proxy_only_overlay(port: int, upstream_port: int) -> str:
    """Bootstrap fragment merged into the estate Envoy's: a listener with the router filter only."""
    listener = http_listener("bench_proxy_only", port, {"route": {"cluster": "bench-proxy-only"}})
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream_port}}}
    cluster = {
        "name": "bench-proxy-only",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": "bench-proxy-only",
            "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
        },
    }
    return json.dumps({"static_resources": {"listeners": [listener], "clusters": [cluster]}})


@dataclass(frozen=True)
class CpuSample:
    at: float
    seconds: float  # user + system CPU of the sampled processes


def session_pids(leader: int) -> list[int]:
    """Every live process in the session led by `leader` (a supervised process and its workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == leader:  # field 6 (session) counted after the ")" of the comm field
            pids.append(int(entry.name))
    return pids


def cpu_seconds(pids: Sequence[int]) -> CpuSample:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return CpuSample(time.monotonic(), total / CLK_TCK)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Rig:
    """Everything a scenario needs; `with Rig(run_dir) as rig:` starts it all, leaving stops it all."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proxy_only_port = free_port()
        self._stack = contextlib.ExitStack()
        self.idp = DevIdentityProvider(alg="RS256", audience=AUDIENCE)
        self.xds = os.environ.get("BENCH_XDS", "delta")
        self.upstream: FastUpstream
        self.estate: Estate

    def __enter__(self) -> Rig:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        pg = self._stack.enter_context(EmbeddedPostgres())
        self._stack.enter_context(self.idp)
        self.upstream = self._stack.enter_context(FastUpstream(self.run_dir))
        options = EstateOptions(
            authz="service",
            authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE, "STOA_AUTHZ_WORKERS": "1"},
            # The incremental chain (delta xDS, routes by scope) unless BENCH_XDS=sotw.
            link_env={"STOA_LINK_XDS": self.xds},
            proc=True,
        )
        self.estate = self._stack.enter_context(Estate(options, postgres=pg, run_dir=self.run_dir / "estate"))
        self.estate.admin.create_tenant(TENANT, exist_ok=True)
        self.estate.admin.add_issuer(TENANT, self.idp.issuer, self.idp.jwks_uri)
        self.estate.admin.wait_synced()
        # The estate's Envoy again, with the proxy-only listener merged into its bootstrap.
        envoy = self.estate.envoy
        envoy.stop()
        envoy.extra_args = (
            "--config-yaml",
            proxy_only_overlay(self.proxy_only_port, self.upstream.ports["a"]),
        )
        envoy.start()
        wait_until(lambda: httpx.get(f"{self.proxy_only_url}/").status_code == 200, 30, "proxy-only listener")

    # -- addresses ----------------------------------------------------------------------------------
    @property
    def proxy_only_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_only_port}"

    @property
    def gateway_url(self) -> str:
        return self.estate.gateway_url

    @property
    def authz_leader(self) -> int:
        authz = self.estate.site.authz if self.estate.site else None
        if authz is None or authz.pid is None:
            raise RuntimeError("stoa-authz is not running")
        return authz.pid

    @property
    def link_pid(self) -> int:
        pid = self.estate.link.pid
        assert pid is not None
        return pid

    # -- authorization service ------------------------------------------------------------------------
    def restart_authz(self, workers: int) -> None:
        """Restart stoa-authz with `workers` processes and wait until a JWT route answers 200 again."""
        site = self.estate.site
        if site is None or site.authz is None:
            raise RuntimeError("stoa-authz is not running")
        site.authz.env["STOA_AUTHZ_WORKERS"] = str(workers)
        site.authz.restart()
        wait_until(
            lambda: len(session_pids(site.authz.pid or 0)) >= workers + (workers > 1),
            30,
            f"{workers} authz worker(s)",
        )

    def relink(self, **settings: str) -> None:
        """Restart the Link with `settings` (STOA_LINK_* names without the prefix, e.g.
        DECISION_PLACEMENT="service") and wait until Envoy holds the configuration it then serves."""
        link = self.estate.link
        before = self.estate.envoy.versions()
        link.env.update({f"STOA_LINK_{name}": value for name, value in settings.items()})
        link.restart()
        wait_until(lambda: self.estate.envoy.versions() != before, 30, f"Envoy configured with {settings}")

    def mint_tokens(self, count: int) -> list[str]:
        return [
            self.idp.mint(tenant=TENANT, scope=SCOPE, sub=f"bench-{i}", lifetime_s=3600) for i in range(count)
        ]

    def ext_authz_checks(self) -> int:
        """Checks Envoy made so far (ext_authz outcomes summed over every HTTP connection manager)."""
        stats = self.estate.envoy.admin_get("/stats", filter=r"^http\..*\.ext_authz\.", format="json").json()
        return sum(
            int(s.get("value", 0))
            for s in stats.get("stats", [])
            if s.get("name", "").rsplit(".", 1)[-1] in ("ok", "denied", "error", "failure_mode_allowed")
        )

    # -- CP -----------------------------------------------------------------------------------------
    def api_body(self, api_id: str, backend: str = "a", *, jwt: bool = False, **extra: Any) -> dict[str, Any]:
        auth = {"mode": "jwt", "scopes": [SCOPE]} if jwt else {"mode": "none", "scopes": []}
        return {
            "api_id": api_id,
            "name": api_id,
            "upstream_url": self.upstream.url(backend),
            "methods": ["GET"],
            "auth": auth,
            **extra,
        }

    def bulk_deploy(self, api_ids: Sequence[str], backend: str = "a", *, create: bool = True) -> int:
        """Create (optionally) and deploy many APIs in one bulk publication; the new generation."""
        gateway = self.estate.gateway_id
        bodies = [self.api_body(a, backend) for a in api_ids] if create else []
        answer = self.estate.admin.bulk(TENANT, apis=bodies, deploy={gateway: api_ids})
        return int(answer["generations"][gateway])

    def bulk_undeploy(self, api_ids: Sequence[str]) -> int:
        """Undeploy many APIs in one bulk publication (one tombstone each); the new generation."""
        gateway = self.estate.gateway_id
        return int(self.estate.admin.bulk(TENANT, undeploy={gateway: api_ids})["generations"][gateway])

    def seed(self, api_ids: Sequence[str], backend: str = "a") -> None:
        """Create and deploy APIs through the CP API, SEED_CONCURRENCY calls in flight."""
        asyncio.run(self._seed(api_ids, backend))

    async def _seed(self, api_ids: Sequence[str], backend: str) -> None:
        gate = asyncio.Semaphore(SEED_CONCURRENCY)
        limits = httpx.Limits(max_connections=SEED_CONCURRENCY)
        async with AsyncCPClient(
            self.estate.cp_url,
            self.estate.admin_token,
            gateway_id=self.estate.gateway_id,
            timeout=60,
            limits=limits,
        ) as cp:

            async def one(api_id: str) -> None:
                async with gate:
                    await cp.create_api(tenant_id=TENANT, **self.api_body(api_id, backend))
                    await cp.deploy(api_id)

            await asyncio.gather(*(one(a) for a in api_ids))

    def answers(self, path: str, status: int = 200, base_url: str | None = None) -> bool:
        return self.estate.gateway.get(f"{base_url or self.gateway_url}{path}").status_code == status


@contextlib.contextmanager
def timer() -> Iterator[list[float]]:
    """`with timer() as t:` … `t[0]` is the elapsed seconds afterwards."""
    out: list[float] = []
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - start)
