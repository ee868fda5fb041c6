"""The Link's ADS server against a real Envoy: bring-up, NACK, identities, loopback, removal order.

The site (`ads_site`, from the suite's conftest) is the Link's own ADS server, Agent and reporter with a
real Envoy; the snapshots are built by hand (`stoa_harness.ads_site`), so a test controls exactly what
Envoy is given and can make Envoy refuse one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from stoa_harness.ads_site import (
    ENVOY_SAN,
    GATEWAY,
    AdsSite,
    make_cluster,
    make_listener,
    make_routes,
    make_snapshot,
)
from stoa_harness.upstream import EchoUpstream
from stoa_harness.wait import wait_until
from stoa_link import certs
from stoa_link.ads import AdsServer, TlsMaterial
from stoa_proto import inventory_pb2
from stoa_translate.snapshot import CLUSTER, ENVOY_TYPES, LISTENER, ROUTE


def test_bring_up_acks_cds_lds_rds_and_reports_synced(ads_site: AdsSite, upstream: EchoUpstream) -> None:
    version = ads_site.snapshots[1].version
    envoy = ads_site.own_envoy
    assert envoy.versions() == {"cds": version, "lds": version, "rds": version}
    acked = {(e.type_url, e.version) for e in ads_site.ads.event_log() if e.kind == "ack"}
    assert {(CLUSTER, version), (LISTENER, version), (ROUTE, version)} <= acked
    # The scripted CP records a report only on the gateway's own path, with its credential.
    report = ads_site.cp.wait_report(1, "SYNCED", timeout=10)
    assert report["snapshot_version"] == version
    assert [int(r["generation"]) for r in ads_site.cp.reports()].count(1) == 1
    upstream.clear()
    assert ads_site.get("/a/hello").status_code == 200
    assert upstream.wait_arrivals(1, path_prefix="/a/hello")[0].path == "/a/hello"


@pytest.mark.parametrize(
    ("generation", "bad", "failed_type", "detail_fragment"),
    [(2, "regex", ROUTE, "missing ): /broken("), (3, "ratelimit", LISTENER, "statprefix")],
)
def test_snapshot_envoy_rejects_is_nacked_reported_failed_and_old_config_serves(
    ads_site: AdsSite,
    upstream: EchoUpstream,
    generation: int,
    bad: str,
    failed_type: str,
    detail_fragment: str,
) -> None:
    good = ads_site.snapshots[1].version
    rejected = make_snapshot(
        generation,
        [make_cluster("backend_a", upstream.port)],
        make_listener(ads_site.listener_port, ratelimit_without_stat_prefix=bad == "ratelimit"),
        make_routes([("/a", "backend_a"), ("/b", "backend_a")], bad_regex=bad == "regex"),
    )
    report = ads_site.apply(generation, rejected)
    assert report is not None
    assert report.status == inventory_pb2.FAILED
    assert inventory_pb2.FailureReason.Name(report.reason) == "NACK"
    assert detail_fragment in report.detail.lower()
    nacks = [e for e in ads_site.ads.event_log() if e.kind == "nack" and e.version == rejected.version]
    assert [e.type_url for e in nacks] == [failed_type]
    # The reporter delivered it to the CP stand-in, with Envoy's own words.
    sent = ads_site.cp.wait_report(generation, "FAILED", timeout=10)
    assert sent["reason"] == "NACK"
    assert detail_fragment in sent["detail"].lower()
    assert [int(r["generation"]) for r in ads_site.cp.reports()].count(generation) == 1
    # The previous snapshot is back everywhere and still serves; the rejected route does not exist.
    envoy = ads_site.own_envoy
    wait_until(
        lambda: envoy.versions() == {"cds": good, "lds": good, "rds": good},
        10,
        "Envoy back on the old version",
    )
    assert ads_site.ads.served_version(ROUTE) == good
    assert ads_site.ads.served_version(LISTENER) == good
    assert ads_site.get("/a/still").status_code == 200
    assert ads_site.get("/b/never").status_code == 404
    assert ads_site.agent.last_applied is not None
    assert ads_site.agent.last_applied.generation == 1


def test_clusters_leave_only_after_the_routes_that_stop_using_them_are_acked(
    ads_site: AdsSite, upstream: EchoUpstream
) -> None:
    start = ads_site.ads.event_log()[-1].seq
    moved = make_snapshot(
        10,
        [make_cluster("backend_b", upstream.port)],
        make_listener(ads_site.listener_port),
        make_routes([("/a", "backend_b")]),
    )
    report = ads_site.apply(10, moved)
    assert report is not None
    assert report.status == inventory_pb2.SYNCED, report
    events = [e for e in ads_site.ads.event_log() if e.seq > start]
    cds_sends = [e for e in events if e.kind == "send" and e.type_url == CLUSTER]
    # First the union (old and new clusters), then the new set alone.
    if ads_site.xds == "sotw":
        assert [set(e.names) for e in cds_sends] == [{"backend_a", "backend_b"}, {"backend_b"}]
    else:  # only what Envoy does not hold travels: the new cluster, then the old one's removal
        sent = [(set(e.names), e.detail) for e in cds_sends]
        assert sent == [({"backend_b"}, ""), (set(), "removed backend_a")]
    removal = cds_sends[1]
    [rds_ack] = [e for e in events if e.kind == "ack" and e.type_url == ROUTE and e.version == moved.version]
    assert rds_ack.seq < removal.seq
    envoy = ads_site.own_envoy
    wait_until(lambda: envoy.versions()["cds"] == moved.version, 10, "Envoy on the final CDS")
    names = {c["cluster"]["name"] for c in envoy.config_dump("dynamic_active_clusters")["configs"]}
    assert names == {"backend_b"}
    assert ads_site.get("/a/moved").status_code == 200


def test_envoy_with_another_uri_san_gets_no_configuration(ads_site: AdsSite) -> None:
    intruder_dir = ads_site.root / "intruder-tls"
    intruder_dir.mkdir()
    issued = certs.issue_client(certs.load_ca(ads_site.tls_dir), "spiffe://stoa.local/intruder")
    (intruder_dir / certs.ENVOY_CERT_FILE).write_bytes(issued.cert_pem)
    (intruder_dir / certs.ENVOY_KEY_FILE).write_bytes(issued.key_pem)
    (intruder_dir / certs.CA_FILE).write_bytes((ads_site.tls_dir / certs.CA_FILE).read_bytes())
    intruder = ads_site.start_envoy("intruder", intruder_dir)
    try:
        wait_until(
            lambda: any(
                e.kind == "refuse" and e.identity == "spiffe://stoa.local/intruder"
                for e in ads_site.ads.event_log()
            ),
            10,
            "the ADS server refusing the intruder",
        )
        dump = intruder.config_dump()
        listeners = [s for s in dump["configs"] if s["@type"].endswith("ListenersConfigDump")]
        assert all(not s.get("dynamic_listeners") for s in listeners)
        clusters = [s for s in dump["configs"] if s["@type"].endswith("ClustersConfigDump")]
        assert all(not s.get("dynamic_active_clusters") for s in clusters)
        assert ads_site.ads.connected("spiffe://stoa.local/intruder") == 0
    finally:
        intruder.stop()


def test_envoy_connecting_later_gets_the_acknowledged_snapshot(ads_site: AdsSite) -> None:
    current = ads_site.ads.acked_snapshot
    assert current is not None
    late = ads_site.start_envoy("late-envoy", ads_site.tls_dir)
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
    wait_until(lambda: ads_site.ads.connected(ENVOY_SAN) == 1, 10, "the late Envoy's stream to close")


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
