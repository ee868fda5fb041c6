"""The consistency check run before a snapshot is served, and the memo the translator keeps."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import stoa_translate
from envoy.config.cluster.v3 import cluster_pb2
from google.protobuf import json_format
from stoa_proto import inventory_pb2
from stoa_translate import TranslateOptions, Translator, translate
from stoa_translate.filters import EXT_PROC_FILTER
from stoa_translate.refusal import FailureReason, Refusal
from stoa_translate.snapshot import CLUSTER, LISTENER, ROUTE, Snapshot, dangling_references

OPTIONS = TranslateOptions()


def inventory(generation: int, *upstreams: str) -> inventory_pb2.Inventory:
    routes = [
        {"route_id": f"r{i}", "tenant_id": "t", "api_id": f"r{i}", "methods": ["GET"], "upstream_url": url}
        for i, url in enumerate(upstreams)
    ]
    doc = {"gateway_id": "gw-1", "generation": str(generation), "routes": routes}
    return json_format.ParseDict(doc, inventory_pb2.Inventory())


def test_a_translated_snapshot_is_consistent() -> None:
    snapshot = translate(inventory(1, "http://10.0.0.1:80", "https://api.example.com"), OPTIONS)
    assert dangling_references(snapshot) == []


def test_missing_clusters_and_route_configuration_are_named() -> None:
    good = translate(inventory(1, "http://10.0.0.1:80", "http://10.0.0.2:80"), OPTIONS)
    # Drop one backend cluster and the ext_authz cluster, and rename the route configuration.
    kept = [c for c in good.of(CLUSTER) if c.name == "backend_http_10.0.0.2_80"]
    (routes,) = good.of(ROUTE)
    renamed = type(routes)()
    renamed.CopyFrom(routes)
    renamed.name = "other-routes"
    broken = Snapshot.build("gw-1", 1, {**good.resources, CLUSTER: kept, ROUTE: [renamed]})
    assert dangling_references(broken) == [
        "listener stoa-listener: route configuration stoa-routes is missing",
        "listener stoa-listener: filter envoy.filters.http.ext_authz names missing cluster stoa-ext-authz",
        "a route names missing cluster backend_http_10.0.0.1_80",
    ]
    # Extra clusters are allowed: they are how make-before-break keeps old routes served.
    extra = cluster_pb2.Cluster(name="backend_http_10.9.9.9_80")
    grown = Snapshot.build("gw-1", 1, {**good.resources, CLUSTER: [*good.of(CLUSTER), extra]})
    assert dangling_references(grown) == []


def test_an_inconsistent_translation_is_refused_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    render = stoa_translate.render_clusters
    monkeypatch.setattr(
        stoa_translate,
        "render_clusters",
        lambda site, options, backends=None: [
            c for c in render(site, options, backends) if c.name != "backend_http_10.0.0.1_80"
        ],
    )
    with pytest.raises(Refusal) as caught:
        translate(inventory(1, "http://10.0.0.1:80", "http://10.0.0.2:80"), OPTIONS)
    assert caught.value.reason == FailureReason.INCONSISTENT_SNAPSHOT
    assert caught.value.detail == "a route names missing cluster backend_http_10.0.0.1_80"


def test_a_translator_remembering_its_last_translation_gives_what_a_fresh_one_gives() -> None:
    remembering = Translator(OPTIONS)
    steps = [
        inventory(1, "http://10.0.0.1:80", "http://10.0.0.2:80"),
        inventory(2, "http://10.0.0.1:80", "http://10.0.0.3:80"),
        inventory(3, "http://10.0.0.1:80"),
        inventory(4, "http://10.0.0.4:80", "http://10.0.0.3:80", "http://10.0.0.1:80"),
    ]
    for step in steps:
        assert remembering.translate(step) == Translator(OPTIONS).translate(step)


def guarded(inventory: inventory_pb2.Inventory, route_id: str) -> inventory_pb2.Inventory:
    """`inventory` with a body policy (guardrails) on one route."""
    policy = {
        "policy_id": "guard",
        "type": "guardrails",
        "scope": "api",
        "targets": [route_id],
        "applicable": [route_id],
        "tenant_id": "t",
        "guardrails": {"blockPatterns": ["secret"]},
    }
    grown = inventory_pb2.Inventory()
    grown.CopyFrom(inventory)
    json_format.ParseDict(policy, grown.policies.add())
    return grown


def test_a_body_policy_switches_processing_on_for_its_route_alone() -> None:
    """The processor is on the listener (off) with or without a body policy: adding one changes the
    route's entries only, and the listener stays the same object's equal."""
    remembering = Translator(OPTIONS)
    plain = inventory(1, "http://10.0.0.1:80", "http://10.0.0.2:80")
    listeners = []
    for step in (plain, guarded(plain, "r0"), plain):
        snapshot = remembering.translate(step)
        assert snapshot == Translator(OPTIONS).translate(step)
        listeners.append(snapshot.of(LISTENER))
        (routes,) = snapshot.of(ROUTE)
        on = {e.name for e in routes.virtual_hosts[0].routes if EXT_PROC_FILTER in e.typed_per_filter_config}
        assert on == (set() if step is plain else {"r0:GET"})
    assert listeners[0] == listeners[1] == listeners[2]


def test_a_one_route_change_resolves_and_renders_that_route_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14: what the Link translates again for a change is the changed route; the rest of the
    rendered snapshot (entries, policy-set entries, clusters) is kept."""
    from stoa_translate import ir, policy_set, routes

    upstreams = [f"http://10.0.{i // 250}.{i % 250 + 1}:80" for i in range(300)]
    remembering = Translator(OPTIONS)
    before = remembering.translate(inventory(1, *upstreams))
    calls = {"resolve": 0, "render": 0, "authz_entry": 0}

    def counting(name: str, function):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(ir, "route_ir", counting("resolve", ir.route_ir))
    monkeypatch.setattr(routes, "route_entries", counting("render", routes.route_entries))
    entry = policy_set.route_entry
    monkeypatch.setattr(policy_set, "route_entry", counting("authz_entry", entry))
    after = remembering.translate(inventory(2, *upstreams[:-1], "http://10.9.9.9:80"))
    assert calls["resolve"] == calls["render"] == 1
    # Every entry of the policy set is looked up; only the changed one is built (a cache miss).
    assert entry.cache_info().currsize >= 300
    kept = {c.name: c for c in before.of(CLUSTER)}
    # Built again: the new backend's cluster and the two services' (one each, whatever the routes).
    assert sum(1 for c in after.of(CLUSTER) if kept.get(c.name) is c) == len(after.of(CLUSTER)) - 3


def test_the_content_version_does_not_depend_on_the_process() -> None:
    # The CP's preview and the Link run in different processes (different string hash seeds): the
    # same inventory must give the same bytes, hence the same version, in both.
    golden = Path(__file__).parent / "golden" / "all_policies" / "inventory.json"
    script = (
        "import sys; from google.protobuf import json_format; from stoa_proto import inventory_pb2;"
        "from stoa_translate import TranslateOptions, translate;"
        "inv = json_format.Parse(open(sys.argv[1]).read(), inventory_pb2.Inventory());"
        "print(translate(inv, TranslateOptions()).version)"
    )
    versions = {
        subprocess.run(
            [sys.executable, "-c", script, str(golden)],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in (1, 2, 3)
    }
    assert len(versions) == 1, versions


def test_every_translation_option_travels_in_the_reported_settings() -> None:
    # A new option must get its TranslateSettings field, or the CP's preview would not see it.
    options = {f.name for f in dataclasses.fields(TranslateOptions)}
    assert options == {f.name for f in inventory_pb2.TranslateSettings.DESCRIPTOR.fields}
    changed = TranslateOptions(
        listener_port=1, ext_proc_address="127.0.0.1:2", required_scopes=("a",), decision_placement="service"
    )
    assert TranslateOptions.from_settings(changed.to_settings()) == changed
    assert TranslateOptions.from_settings(inventory_pb2.TranslateSettings()) == TranslateOptions()
