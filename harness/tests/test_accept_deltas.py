"""Issue 14 acceptance: deltas on the event stream, through a real Link and a real Envoy.

A scripted CP sends what changed; the Link applies it to the last complete inventory, checks the
content hash and fetches the complete inventory when a delta is corrupted, leaves a gap, or the Link
restarts. What Envoy serves is always a complete inventory that went through the guard.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from stoa_harness.metrics import scrape
from stoa_harness.scripted_cp import ScriptedCP, add_open_route
from stoa_harness.site import Site
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until
from stoa_proto import inventory_pb2

GATEWAY = "gw-deltas"


class DeltaSite:
    def __init__(self, cp: ScriptedCP, site: Site, upstream: EchoUpstream) -> None:
        self.cp, self.site, self.upstream = cp, site, upstream
        self.current = inventory_pb2.Inventory(gateway_id=GATEWAY, generation=1)
        self.client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10.0)

    def next(self, *, add: str = "", remove: str = "") -> inventory_pb2.Inventory:
        """The current inventory one generation on, with a route added or tombstoned."""
        new = inventory_pb2.Inventory()
        new.CopyFrom(self.current)
        new.generation += 1
        if add:
            add_open_route(new, add, self.upstream.url)
        if remove:
            kept = [r for r in new.routes if r.route_id != remove]
            del new.routes[:]
            new.routes.extend(kept)
            new.tombstones.add(route_id=remove, generation=new.generation)
        return new

    def send(self, inventory: inventory_pb2.Inventory, **how: object) -> dict[str, object]:
        mark = len(self.cp.reports())
        self.cp.push_delta(inventory, **how)  # type: ignore[arg-type]
        report = self.cp.wait_report(inventory.generation, "SYNCED", after=mark)
        self.current = inventory
        return report

    def served(self, route_id: str) -> dict[str, object]:
        response = self.client.get(f"{self.site.gateway_url}/apis/{route_id}/x")
        assert response.status_code == 200, (route_id, response.status_code)
        return response.json()  # type: ignore[no-any-return]

    def metric(self, name: str) -> dict[str, float]:
        return {k: v for k, v in scrape(self.site.link_http_url).items() if k.partition("{")[0] == name}


@pytest.fixture(scope="module")
def delta_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeltaSite]:
    credential = "delta-credential-0123456789"
    with EchoUpstream() as upstream, ScriptedCP(GATEWAY, credential) as cp:
        site = cp.site(tmp_path_factory.mktemp("delta-site"))
        with site:
            ds = DeltaSite(cp, site, upstream)
            first = ds.next(add="d1")
            cp.push(first)
            ds.current = first
            cp.wait_report(first.generation, "SYNCED")
            wait_until(lambda: cp.stream_count() >= 1, 20, "the Link following the event stream")
            yield ds
            ds.client.close()


def test_a_delta_is_applied_without_fetching_the_inventory(delta_site: DeltaSite) -> None:
    fetches = delta_site.cp.config_fetches()
    delta_site.send(delta_site.next(add="d2"))
    wait_until(lambda: delta_site.served("d2")["path"] == "/d2/x", 10, "route d2 served")
    delta_site.send(delta_site.next(remove="d2"))
    assert delta_site.client.get(f"{delta_site.site.gateway_url}/apis/d2/x").status_code == 404
    assert delta_site.served("d1")["path"] == "/d1/x"
    assert delta_site.cp.config_fetches() == fetches


def test_a_corrupted_delta_is_healed_by_the_complete_inventory(delta_site: DeltaSite) -> None:
    fetches = delta_site.cp.config_fetches()
    # The delta's route points elsewhere than the hashed (and /config) one: never served.
    delta_site.send(delta_site.next(add="d3"), corrupt=True)
    assert delta_site.served("d3")["path"] == "/d3/x"
    assert delta_site.cp.config_fetches() == fetches + 1
    assert delta_site.metric("stoa_link_inventory_refetches_total") == {
        'stoa_link_inventory_refetches_total{why="mismatch"}': 1
    }


def test_a_delta_that_cannot_be_read_is_healed_by_the_complete_inventory(delta_site: DeltaSite) -> None:
    link = delta_site.site.link
    assert link is not None
    fetches = delta_site.cp.config_fetches()
    # Valid JSON that no delta can hold (a string with an unpaired surrogate): the Link fetches the
    # complete inventory and keeps following the stream.
    broken = '{"schema_version": 2, "generation": "99", "routes": [{"route_id": "\\ud800"}]}'
    delta_site.send(delta_site.next(add="d7"), data=broken)
    assert delta_site.served("d7")["path"] == "/d7/x"
    assert delta_site.cp.config_fetches() == fetches + 1
    assert link.running
    delta_site.send(delta_site.next(add="d8"))
    assert delta_site.served("d8")["path"] == "/d8/x"
    assert delta_site.cp.config_fetches() == fetches + 1


def test_a_gap_in_generations_is_healed_by_the_complete_inventory(delta_site: DeltaSite) -> None:
    fetches = delta_site.cp.config_fetches()
    # A delta from a generation the Link never saw (the one before was lost).
    skipped = delta_site.next(add="d4")
    delta_site.current = skipped
    ahead = delta_site.next(add="d5")
    delta_site.send(ahead, base=skipped.generation)
    assert delta_site.served("d4")["path"] == "/d4/x"
    assert delta_site.served("d5")["path"] == "/d5/x"
    assert delta_site.cp.config_fetches() == fetches + 1


def test_a_restarted_link_fetches_the_complete_inventory_then_follows_deltas(delta_site: DeltaSite) -> None:
    link = delta_site.site.link
    assert link is not None
    fetches = delta_site.cp.config_fetches()
    opened = len(delta_site.site.link_events("cp_stream_open"))
    link.restart()
    wait_until(
        lambda: len(delta_site.site.link_events("cp_stream_open")) > opened, 20, "the restarted Link's stream"
    )
    assert delta_site.cp.config_fetches() == fetches + 1
    delta_site.send(delta_site.next(add="d6"))
    assert delta_site.site.link_events("inventory_received")[-1]["source"] == "delta"
    assert delta_site.served("d6")["path"] == "/d6/x"
    assert delta_site.served("d1")["path"] == "/d1/x"
    assert delta_site.cp.config_fetches() == fetches + 1


def test_a_link_restarted_over_changes_sends_envoy_only_what_is_served_now(delta_site: DeltaSite) -> None:
    """Envoy reconnects to the restarted Link with the versions it holds: a route removed and one added
    while the Link was down are, after it, 404 and served, and the kept ones still served."""
    link = delta_site.site.link
    assert link is not None
    delta_site.send(delta_site.next(add="d9"))
    assert delta_site.served("d9")["path"] == "/d9/x"
    link.stop()
    changed = delta_site.next(add="d10", remove="d9")
    delta_site.cp.push(changed)  # what the CP serves while the Link is away
    delta_site.current = changed
    mark = len(delta_site.cp.reports())
    link.start()
    delta_site.cp.wait_report(changed.generation, "SYNCED", after=mark)
    wait_until(lambda: delta_site.served("d10")["path"] == "/d10/x", 10, "route d10 served")
    assert delta_site.client.get(f"{delta_site.site.gateway_url}/apis/d9/x").status_code == 404
    assert delta_site.served("d1")["path"] == "/d1/x"
