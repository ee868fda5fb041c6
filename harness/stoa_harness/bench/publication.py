"""Publication: how fast a published route serves, with 100 … 10,000 routes already published.

- New route: the API is created first (no publication), then the deployment call `PUT
  /v1/gateways/{g}/deployments/{api}` is timed from its return to the first 200 through Envoy (the
  listener polled every POLL_S on fresh connections). Each sample starts from a SYNCED gateway.
- 1-route change at 100 and at 10,000 (their ratio, issue 14): an API edit (`PUT …/apis/{api}`
  moving its path prefix) timed from its return to the CP status SYNCED at that generation, and to
  the new path answering 200; with the bytes of the event that carried it to the Link.
- Full publication of 10,000 routes ("deploy-all"): the bench routes are undeployed in one
  generation, then all deployed again in one transaction (see `Rig.bulk_deploy`); timed from that
  commit to SYNCED, and to the last route answering 200. It runs the whole pipeline once for all
  10,000 routes: CP inventory → SSE → Link guard + translation → authz policy set ACK → Envoy
  CDS/LDS/RDS ACK → sync report.
- Its floor (issue 14): the time a second Envoy takes to accept the same 10,000 routes as one
  state-of-the-world RouteConfiguration pushed by a minimal ADS server (the Link's ADS server alone,
  in process: no CP, no translation timed, no policy set), measured in the same run; the full publication
  is reported as a ratio to it. Envoy's resident memory at 10,000 routes, for the estate's Envoy (its
  xDS variant) and for that one-table Envoy.
"""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from envoy.config.route.v3 import route_pb2
from google.protobuf import json_format
from stoa_proto import inventory_pb2
from stoa_translate import TranslateOptions, translate
from stoa_translate.snapshot import CLUSTER, LISTENER, ROUTE, Snapshot

from stoa_harness.ads_site import GATEWAY, AdsSite
from stoa_harness.bench.report import percentile, spread
from stoa_harness.bench.rig import TENANT, Rig, rss_mib
from stoa_harness.cp_client import CPClient
from stoa_harness.wait import GiveUp, wait_until

POLL_S = 0.005
PREFIX = "pub"


class Ladder:
    """The bench routes published so far (`pub-NNNNN`), grown in bulk between measurements."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.ids: list[str] = []

    def grow_to(self, count: int) -> None:
        new = [f"{PREFIX}-{i:05d}" for i in range(len(self.ids), count)]
        if new:
            self.rig.estate.admin.wait_synced(self.rig.bulk_deploy(new), timeout=120)
            self.ids += new

    def _serving(
        self,
        path: str,
        deadline_s: float = 30.0,
        start: float | None = None,
        beside: Future[Any] | None = None,
    ) -> float:
        """s from `start` (now by default) to `path` answering 200 through Envoy. `beside`: a wait
        running meanwhile whose failure (a FAILED publication) ends this one at once, with its reason."""
        start = time.perf_counter() if start is None else start

        def answers() -> bool:
            if beside is not None and beside.done() and (failed := beside.exception()) is not None:
                raise GiveUp(f"{path}: {failed}") from failed
            return self.rig.answers(path)

        wait_until(answers, deadline_s, f"{path} answering 200", interval=POLL_S)
        return time.perf_counter() - start

    def new_routes(self, samples: int) -> list[float]:
        """`samples` publications through the CP API; ms from the deployment call's return to 200."""
        estate = self.rig.estate
        out = []
        for _ in range(samples):
            api_id = f"{PREFIX}-{len(self.ids):05d}"
            estate.admin.create_api(tenant_id=TENANT, **self.rig.api_body(api_id))
            estate.admin.deploy(api_id)
            out.append(self._serving(f"/apis/{api_id}/x") * 1000)
            self.ids.append(api_id)
            estate.admin.wait_synced(timeout=60)
        return out

    def _event_bytes(self, generation: int) -> int:
        """Bytes of the event that brought `generation` to the Link (from its log; 0 when none did)."""
        link = self.rig.estate.link
        sizes = [
            int(event.get("bytes", 0))
            for event in map(
                json.loads,
                filter(
                    lambda line: line.startswith("{"), link.log_path.read_text(errors="replace").splitlines()
                ),
            )
            if event.get("event") == "inventory_received" and event.get("generation") == generation
        ]
        return sizes[-1] if sizes else 0

    def _synced_after(self, start: float) -> tuple[float, int]:
        """s from `start` to the CP status SYNCED at the generation desired now, and that generation."""
        admin = self.rig.estate.admin
        target = admin.desired_generation()

        def synced() -> bool:
            status = admin.status()
            if status["state"] == "FAILED":
                raise GiveUp(f"1-route change FAILED: {status['last_report']}")
            return int(status.get("acknowledged_generation") or 0) >= target and status["state"] == "SYNCED"

        wait_until(synced, 60, "1-route change SYNCED", interval=POLL_S)
        return time.perf_counter() - start, target

    def one_change(self, samples: int, tag: str) -> dict[str, Any]:
        """Edit one API's path prefix; ms to SYNCED and ms to the new path serving, and the bytes the
        event stream carried to the Link for it. `tag` makes each run's prefixes new."""
        estate = self.rig.estate
        synced_ms, serving_ms, event_bytes = [], [], []
        for n in range(samples):
            api_id = self.ids[n]
            new_prefix = f"/apis/{api_id}-moved-{tag}-{n}"
            body = self.rig.api_body(api_id, path_prefix=new_prefix)
            estate.admin.update_api(api_id, body, tenant_id=TENANT)
            start = time.perf_counter()
            # The CP's status is polled on a thread of its own: polled in turn with the requests
            # through Envoy, each turn's CP call delayed the request that sees the change serve.
            with ThreadPoolExecutor(1) as status_poll:
                synced = status_poll.submit(self._synced_after, start)
                serving_s = self._serving(f"{new_prefix}/x", 60, start, beside=synced)
                synced_s, target = synced.result(timeout=60)
            synced_ms.append(synced_s * 1000)
            serving_ms.append(serving_s * 1000)
            event_bytes.append(self._event_bytes(target))
        return {
            "synced_ms": spread(synced_ms),
            "serving_ms": spread(serving_ms),
            "event_bytes": spread(event_bytes),
            "samples_synced_ms": synced_ms,
            "samples_serving_ms": serving_ms,
        }

    def full(self, samples: int) -> dict[str, Any]:
        """Undeploy every bench route, then deploy all of them in one generation; s to SYNCED/serving."""
        estate = self.rig.estate
        synced_s, serving_s = [], []
        last_path = f"/apis/{self.ids[-1]}/x"
        for _ in range(samples):
            estate.admin.wait_synced(self.rig.bulk_undeploy(self.ids), timeout=120)
            wait_until(lambda: self.rig.answers(last_path, 404), 30, f"{last_path} gone")
            generation = self.rig.bulk_deploy(self.ids, create=False)
            start = time.perf_counter()
            estate.admin.wait_synced(generation, timeout=120)
            synced_s.append(time.perf_counter() - start)
            wait_until(lambda: self.rig.answers(last_path), 30, f"{last_path} serving", interval=POLL_S)
            serving_s.append(time.perf_counter() - start)
        return {
            "synced_s": spread(synced_s),
            "serving_s": spread(serving_s),
            "samples_synced_s": synced_s,
            "samples_serving_s": serving_s,
            "routes": len(self.ids),
            "envoy_rss_mib": rss_mib(estate.envoy.pid or 0),
        }

    def floor(self, samples: int) -> dict[str, Any]:
        """s for a second Envoy to accept the gateway's routes as one route table (the Link's own
        translation of its inventory, with its reported settings but no scopes) pushed alone, state of
        the world, by the Link's ADS server in process; each sample replaces an empty table of the same
        name. Also that Envoy's resident memory with the table."""
        estate = self.rig.estate
        # The preview translates all 10,000 routes at the CP: more than a call's usual time when loaded.
        with CPClient(estate.cp_url, estate.admin_token, gateway_id=estate.gateway_id, timeout=300) as cp:
            settings = cp.preview()["settings"]
        reported = json_format.ParseDict(settings, inventory_pb2.TranslateSettings())
        inventory = json_format.ParseDict(estate.inventory(), inventory_pb2.Inventory())
        site = AdsSite(self.rig.run_dir / "floor", xds="sotw")
        try:
            options = dataclasses.replace(
                TranslateOptions.from_settings(reported), route_scopes=False, listener_port=site.listener_port
            )
            translated = translate(inventory, options)
            clusters, listeners = translated.of(CLUSTER), translated.of(LISTENER)
            tables = translated.of(ROUTE)
            empty = [route_pb2.RouteConfiguration(name=t.name) for t in tables]  # type: ignore[attr-defined]
            accept_s = []
            for n in range(samples):
                for generation, routes in ((2 * n + 1, empty), (2 * n + 2, tables)):
                    snapshot = Snapshot.build(
                        GATEWAY, generation, {CLUSTER: clusters, LISTENER: listeners, ROUTE: routes}
                    )
                    start = time.perf_counter()
                    result = site.publish(snapshot)
                    if not result.acked:
                        raise AssertionError(f"floor publication refused: {result.reason} {result.detail}")
                accept_s.append(time.perf_counter() - start)
            return {
                "accept_s": spread(accept_s),
                "samples_accept_s": accept_s,
                "envoy_rss_mib": rss_mib(site.own_envoy.pid or 0),
            }
        finally:
            site.close()


def summarise(
    samples_ms: dict[int, list[float]],
    change: dict[str, Any],
    full: dict[str, Any],
    change_small: dict[str, Any],
    floor: dict[str, Any],
    xds: str,
) -> dict[str, Any]:
    small, large = min(samples_ms), max(samples_ms)
    return {
        "xds": xds,
        "full_10000_floor_ratio": full["synced_s"]["median"] / floor["accept_s"]["median"],
        "full_10000_floor_s": floor["accept_s"]["median"],
        "floor": floor,
        "envoy_rss_mib_10000": full["envoy_rss_mib"],
        "envoy_rss_mib_10000_one_table": floor["envoy_rss_mib"],
        # Issue 14: the cost of a change at 10,000 routes against the same at 100, in one run.
        "one_change_ratio": change["serving_ms"]["median"] / change_small["serving_ms"]["median"],
        "new_route_ratio": percentile(samples_ms[large], 99) / percentile(samples_ms[small], 99),
        "sse_bytes_one_change_10000": change["event_bytes"]["median"],
        "sse_bytes_one_change_100": change_small["event_bytes"]["median"],
        "one_change_100_ms": change_small["synced_ms"]["median"],
        "one_change_100_serving_ms": change_small["serving_ms"]["median"],
        "one_change_100": change_small,
        "new_route_p50_ms": {str(c): percentile(s, 50) for c, s in samples_ms.items()},
        "new_route_p99_ms": {str(c): percentile(s, 99) for c, s in samples_ms.items()},
        "samples_ms": {str(c): s for c, s in samples_ms.items()},
        "full_10000_s": full["synced_s"]["median"],
        "full_10000_serving_s": full["serving_s"]["median"],
        "full_10000": full,
        "one_change_10000_ms": change["synced_ms"]["median"],
        "one_change_10000_serving_ms": change["serving_ms"]["median"],
        "one_change_10000": change,
        "definition": {
            "new_route": "PUT deployment returned → first 200 through Envoy (fresh connection, 5 ms poll)",
            "full_10000": "all 10,000 bench routes deployed in one generation (after undeploying them)"
            " → CP status SYNCED at that generation",
            "one_change_10000": "PUT API (path prefix moved) returned → SYNCED / new path answering 200",
            "one_change_ratio": "1-route change at 10,000 routes ÷ at 100 (PUT API returned → new path"
            " answering 200), medians of one run",
            "new_route_ratio": "new-route p99 at 10,000 routes ÷ at 100",
            "full_10000_floor_ratio": "full_10000 (to SYNCED) ÷ the time a second Envoy takes to accept the"
            " same routes as one state-of-the-world RouteConfiguration pushed alone by the Link's ADS"
            " server in process (medians of one run)",
            "envoy_rss_mib_10000": "the estate Envoy's resident memory after the full publication (its xDS"
            " variant); _one_table: the floor's Envoy holding the one table",
            "sse_bytes": "bytes of the event that brought the change to the Link (its log)",
            "seeding": "bulk through SQL in one CP-style transaction per step (see rig.py);"
            " measured publications through the CP API",
        },
    }
