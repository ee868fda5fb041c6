"""Route scopes through the Link's ADS server and a real Envoy: on delta xDS the translator's scopes and
bucketed route tables (Scoped RDS), on state of the world its one route table. A change re-sends only
its key's table (delta), a new and a removed API take effect, a table Envoy refuses is NACKed and the
acknowledged configuration keeps serving."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from envoy.config.route.v3 import route_pb2
from envoy.type.matcher.v3 import regex_pb2
from google.protobuf import json_format
from stoa_harness.ads_site import GATEWAY, AdsSite
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until
from stoa_harness.witness import CheckWitness
from stoa_proto import inventory_pb2
from stoa_translate import TranslateOptions, Translator
from stoa_translate.routes import table_name
from stoa_translate.snapshot import ROUTE, SCOPED_ROUTE, Snapshot


class ScopedSite:
    def __init__(self, site: AdsSite, upstream: EchoUpstream, witness: CheckWitness) -> None:
        self.site = site
        self.upstream = upstream
        self.translator = Translator(
            TranslateOptions(
                listener_port=site.listener_port,
                ext_authz_address=witness.address,
                route_scopes=site.xds == "delta",
            )
        )

    def snapshot(
        self, generation: int, apis: dict[str, list[str]], unkeyed: tuple[str, ...] = ()
    ) -> Snapshot:
        """`apis` under `/apis/<api>`, and `unkeyed` APIs under `/<api>` (no scope key)."""
        routes = [
            {
                "route_id": api,
                "tenant_id": "t",
                "api_id": api,
                "path_prefix": f"/{api}" if api in unkeyed else f"/apis/{api}",
                "methods": methods,
                "upstream_url": f"http://127.0.0.1:{self.upstream.port}",
            }
            for api, methods in {**apis, **{api: ["GET"] for api in unkeyed}}.items()
        ]
        doc = {"gateway_id": GATEWAY, "generation": str(generation), "routes": routes}
        return self.translator.translate(json_format.ParseDict(doc, inventory_pb2.Inventory()))

    def apply(self, generation: int, snapshot: Snapshot) -> inventory_pb2.SyncReport:
        report = self.site.apply(generation, snapshot)
        assert report is not None
        return report

    def status(self, path: str, method: str = "GET") -> int:
        return httpx.request(
            method, f"http://127.0.0.1:{self.site.listener_port}{path}", timeout=5
        ).status_code

    def rds_sent_since(self, seq: int) -> list[tuple[str, ...]]:
        return [
            e.names
            for e in self.site.ads.event_log()
            if e.seq > seq and e.kind == "send" and e.type_url == ROUTE
        ]


@pytest.fixture(scope="module", params=["sotw", "delta"])
def scoped(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, upstream: EchoUpstream
) -> Iterator[ScopedSite]:
    with CheckWitness() as witness:
        site = AdsSite(tmp_path_factory.mktemp(f"ads-scopes-{request.param}"), xds=request.param)
        try:
            yield ScopedSite(site, upstream, witness)
        finally:
            site.close()


def test_routes_change_one_table_at_a_time_and_a_refused_table_changes_nothing(scoped: ScopedSite) -> None:
    delta = scoped.site.xds == "delta"
    first = scoped.snapshot(1, {"a": ["GET"], "b": ["GET"], "c": ["GET"]})
    assert bool(first.of(SCOPED_ROUTE)) == delta
    assert scoped.apply(1, first).status == inventory_pb2.SYNCED
    assert [scoped.status(f"/apis/{api}/x") for api in "abc"] == [200, 200, 200]

    mark = scoped.site.ads.event_log()[-1].seq
    edited = scoped.snapshot(2, {"a": ["GET"], "b": ["GET", "POST"], "c": ["GET"]})
    assert scoped.apply(2, edited).status == inventory_pb2.SYNCED
    assert scoped.status("/apis/b/x", "POST") == 200
    # Delta: only b's table travels; state of the world: the one table.
    assert scoped.rds_sent_since(mark) == [(table_name("b"),) if delta else ("stoa-routes",)]

    moved = scoped.snapshot(3, {"b": ["GET", "POST"], "c": ["GET"], "d": ["GET"]})
    assert scoped.apply(3, moved).status == inventory_pb2.SYNCED
    assert [scoped.status(f"/apis/{api}/x") for api in "abcd"] == [404, 200, 200, 200]

    refused = scoped.snapshot(4, {"b": ["GET", "POST"], "c": ["GET"], "d": ["GET"], "e": ["GET"]})
    broken = Snapshot.build(
        GATEWAY, 4, {**refused.resources, ROUTE: [_broken(t, "e") for t in refused.of(ROUTE)]}
    )
    report = scoped.apply(4, broken)
    assert (report.status, inventory_pb2.FailureReason.Name(report.reason)) == (inventory_pb2.FAILED, "NACK")
    assert [scoped.status(f"/apis/{api}/x") for api in "bcde"] == [200, 200, 200, 404]

    again = scoped.snapshot(5, {"b": ["GET", "POST"], "c": ["GET"], "d": ["GET"], "e": ["GET"]})
    assert scoped.apply(5, again).status == inventory_pb2.SYNCED
    assert [scoped.status(f"/apis/{api}/x") for api in "bcde"] == [200, 200, 200, 200]


def _broken(table: route_pb2.RouteConfiguration, route_id: str) -> route_pb2.RouteConfiguration:
    """`table` with an entry Envoy refuses (an invalid regex) where it holds `route_id`'s entries."""
    copy = route_pb2.RouteConfiguration()
    copy.CopyFrom(table)
    host = copy.virtual_hosts[0]
    if any(r.name.startswith(f"{route_id}:") for r in host.routes):
        bad = host.routes.add(name="broken")
        bad.match.safe_regex.CopyFrom(regex_pb2.RegexMatcher(regex="/broken("))
        bad.direct_response.status = 200
    return copy


@pytest.fixture
def fresh_scoped(tmp_path_factory: pytest.TempPathFactory, upstream: EchoUpstream) -> Iterator[ScopedSite]:
    """A delta site whose Envoy holds no listener replaced before (none draining)."""
    with CheckWitness() as witness:
        site = AdsSite(tmp_path_factory.mktemp("ads-switch"), xds="delta")
        try:
            yield ScopedSite(site, upstream, witness)
        finally:
            site.close()


def test_new_connections_are_served_throughout_a_switch_of_the_routing(fresh_scoped: ScopedSite) -> None:
    """An API whose prefix gives no scope key takes the gateway to one table and its removal back to
    scopes: each switch replaces the listener, and the one it replaces keeps accepting connections
    until the new one is warm. Neither may meet a routing the switch already took away; nor may the
    switch back meet the one table as the listener of the first switch, still draining, holds it
    (closed): Envoy shares a table by name between listeners."""
    scoped = fresh_scoped
    apis = {f"a{i:04d}": ["GET"] for i in range(1000)}
    one_table = scoped.snapshot(10, apis, unkeyed=("catchall",))
    assert not one_table.of(SCOPED_ROUTE)
    assert scoped.apply(10, one_table).status == inventory_pb2.SYNCED
    to_scopes = scoped.snapshot(11, apis)
    assert to_scopes.of(SCOPED_ROUTE)
    assert set(_answers_during(scoped, 11, to_scopes)) == {200}
    back = scoped.snapshot(12, apis, unkeyed=("catchall",))
    assert set(_answers_during(scoped, 12, back)) == {200}
    assert scoped.status("/catchall/x") == 200


def _answers_during(scoped: ScopedSite, generation: int, snapshot: Snapshot) -> Counter[int]:
    """The statuses of requests on new connections, one after another, while `snapshot` is applied
    (synced), up to a request sent after it; 0 for a connection refused or reset."""
    url = f"http://127.0.0.1:{scoped.site.listener_port}/apis/a0007/x"
    answers: Counter[int] = Counter()
    stop = threading.Event()

    def new_connections() -> None:
        while not stop.is_set():
            try:
                answers[httpx.get(url, headers={"connection": "close"}, timeout=5).status_code] += 1
            except httpx.HTTPError:
                answers[0] += 1

    thread = threading.Thread(target=new_connections)
    thread.start()
    try:
        wait_until(lambda: answers[200] > 0, 10, "requests through the gateway")
        assert scoped.apply(generation, snapshot).status == inventory_pb2.SYNCED
        seen = sum(answers.values())
        wait_until(lambda: sum(answers.values()) > seen, 10, "a request after the switch")
    finally:
        stop.set()
        thread.join()
    return answers
